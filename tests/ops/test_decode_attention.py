"""decode_attention (and the DecodeAttention layer): the forward-only C++ kernel against the reference."""
from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import forward_ad

import fastqa
from fastqa import reference
from fastqa._backend import cpu_available, triton_usable_here
from fastqa.layers import DecodeAttention

from helpers import TOLERANCES, assert_close, check_bf16_against_float64, device_of, padding_mask, ran_ops

pytestmark = pytest.mark.skipif(not cpu_available(), reason="the kernel is C++ only: needs fastqa._C")

# (B, R, S, E, Ev): ConvS2S greedy (one row per sentence) and beam 5 (the folded memory: Ev = H), then
# edges: one position, widths below the vector width, more rows than positions, value widths with a partial
# block of columns past 16 and as many rows as the bf16 pair-product path keeps in registers (8).
REAL = [(16, 1, 30, 256, 256), (4, 5, 23, 256, 512)]
EDGE = [(1, 1, 1, 1, 1), (3, 2, 5, 3, 7), (2, 9, 4, 17, 5), (2, 8, 9, 33, 49)]


def make_inputs(b, r, s, e, ev, *, dtype=torch.float32, seed=0, bias=None, mask=True):
    """q, keys, values, bias ([B, 1, S], [B, R, S] or None) and a padding mask (right, left, a hole)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, r, e, generator=g, dtype=dtype)
    keys = torch.randn(b, s, e, generator=g, dtype=dtype) / math.sqrt(e)
    values = torch.randn(b, s, ev, generator=g, dtype=dtype)
    bias_t = None if bias is None else torch.randn(b, bias, s, generator=g, dtype=dtype)
    mask_t = padding_mask(b, s, seed) if mask and s > 1 else None
    return q, keys, values, bias_t, mask_t


def both(q, keys, values, bias, mask, scale=0.7):
    with torch.no_grad():
        got = fastqa.decode_attention(q, keys, values, bias, mask, scale=scale, backend="cpu")
    want = reference.decode_attention(q, keys, values, bias, mask, scale=scale)
    return got, want


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias, mask", [(None, True), ("shared", True), ("per_row", False), (None, False)])
def test_matches_reference(shape, dtype, bias, mask):
    rows = {None: None, "shared": 1, "per_row": shape[1]}[bias]
    inputs = make_inputs(*shape, dtype=dtype, bias=rows, mask=mask)
    (out, weights), (out_ref, weights_ref) = both(*inputs)
    atol, rtol = TOLERANCES["same dtype"][dtype]
    assert_close(out, out_ref, name="out", atol=atol, rtol=rtol)
    assert_close(weights, weights_ref, name="weights", atol=atol, rtol=rtol)
    if inputs[4] is not None:
        assert (weights.masked_select(~inputs[4].unsqueeze(1)) == 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


def test_masked_positions_are_not_read_and_an_empty_row_gives_zeros():
    """NaN keys and values at masked positions change nothing (the kernel never reads them); a batch element
    with no unmasked position gets zero weights and a zero output, as the reference."""
    q, keys, values, _, mask = make_inputs(4, 3, 9, 8, 6)
    mask[3] = False
    (out, weights), (out_ref, weights_ref) = both(q, keys, values, None, mask)
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    poisoned_k[~mask] = float("nan")
    poisoned_v[~mask] = float("inf")
    with torch.no_grad():
        out_p, weights_p = fastqa.decode_attention(q, poisoned_k, poisoned_v, None, mask, scale=0.7, backend="cpu")
    assert torch.equal(out_p, out) and torch.equal(weights_p, weights)
    assert (out[3] == 0).all() and (weights[3] == 0).all()
    assert_close(out, out_ref, name="out")
    assert_close(weights, weights_ref, name="weights")


def test_runs_the_kernel_only_without_gradients():
    q, keys, values, bias, mask = make_inputs(3, 2, 7, 8, 8, bias=1)
    with torch.no_grad():
        assert ran_ops(lambda: fastqa.decode_attention(q, keys, values, bias, mask)) == {"fastqa::decode_attention"}
    # Autograd recording: the reference runs, and its gradients are the reference's.
    leaves = [t.clone().requires_grad_() for t in (q, keys, values, bias)]
    assert ran_ops(lambda: fastqa.decode_attention(*leaves, mask)) == set()
    out, weights = fastqa.decode_attention(*leaves, mask, scale=0.5)
    ref_leaves = [t.clone().requires_grad_() for t in (q, keys, values, bias)]
    out_ref, weights_ref = reference.decode_attention(*ref_leaves, mask, scale=0.5)
    g = torch.randn(out.shape)
    for got, want, name in zip(torch.autograd.grad((out * g).sum() + weights.sum(), leaves),
                               torch.autograd.grad((out_ref * g).sum() + weights_ref.sum(), ref_leaves),
                               ("q", "keys", "values", "bias")):
        assert_close(got, want, name=f"grad of {name}")


def test_forward_mode_tangent_is_the_references():
    q, keys, values, _, mask = make_inputs(2, 1, 6, 4, 4)
    tangent = torch.randn(q.shape)
    with forward_ad.dual_level():
        out = fastqa.decode_attention(forward_ad.make_dual(q, tangent), keys, values, None, mask)[0]
        got = forward_ad.unpack_dual(out).tangent
    _, want = torch.func.jvp(lambda t: reference.decode_attention(t, keys, values, None, mask)[0], (q,), (tangent,))
    assert got is not None and want.abs().max() > 0
    assert_close(got, want, name="tangent")


def test_layer_and_opcheck():
    q, keys, values, bias, mask = make_inputs(3, 2, 5, 8, 4, bias=2)
    layer, ref_layer = DecodeAttention(), reference.DecodeAttention()
    assert list(layer.state_dict()) == [] == list(ref_layer.state_dict())
    with torch.no_grad():
        for got, want in zip(layer(q, keys, values, bias, mask, scale=0.3),
                             ref_layer(q, keys, values, bias, mask, scale=0.3)):
            assert_close(got, want, name="layer")
    torch.library.opcheck(torch.ops.fastqa.decode_attention, (q, keys, values, bias, mask, 0.3))
    torch.library.opcheck(torch.ops.fastqa.decode_attention, (q, keys, values, None, None, 1.0))


@pytest.mark.parametrize("bad, error, match", [
    (lambda q, k, v, b, m: (q[0], k, v, b, m), ValueError, "q must have 3 dimensions"),
    (lambda q, k, v, b, m: (q, k[:, :, :3], v, b, m), ValueError, "keys must have shape"),
    (lambda q, k, v, b, m: (q, k, v[:, :2], b, m), ValueError, "values must have shape"),
    (lambda q, k, v, b, m: (q, k, v.double(), b, m), TypeError, "values must have dtype"),
    (lambda q, k, v, b, m: (q, k, v, b[:, :, :2], m), ValueError, "bias must have shape"),
    (lambda q, k, v, b, m: (q, k, v, b, m.float()), TypeError, "mask must have dtype torch.bool"),
    (lambda q, k, v, b, m: (q, k, v, b, m[:, :2]), ValueError, "mask must have shape"),
    (lambda q, k, v, b, m: (q, k[:, :0], v[:, :0], None, None), ValueError, "keys must have a non-zero size"),
])
def test_bad_arguments_name_the_argument(bad, error, match):
    with pytest.raises(error, match=match):
        fastqa.decode_attention(*bad(*make_inputs(2, 3, 5, 4, 6, bias=1)))


@pytest.mark.skipif(not triton_usable_here(), reason="the triton backend cannot run here")
def test_triton_backend_is_the_gpu_path():
    """backend="triton" (what "auto" runs on CUDA) is the reference's batched GEMMs: its values, no custom op."""
    device = device_of("triton")
    args = [None if t is None else t.to(device) for t in make_inputs(2, 3, 5, 4, 6, bias=1)]
    got = fastqa.decode_attention(*args, scale=0.7, backend="triton")
    want = reference.decode_attention(*args, scale=0.7)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not ran_ops(lambda: fastqa.decode_attention(*args, backend="triton"))


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("bias, mask", [(None, True), ("shared", True), ("per_row", False)])
def test_bfloat16_matches_float64_reference(shape, bias, mask):
    """bf16 in, out and weights in bf16 (the kernel's float32 loops inside), against float64 on the same rounded
    values; forward only, as the kernel."""
    rows = {None: None, "shared": 1, "per_row": shape[1]}[bias]
    args = make_inputs(*shape, bias=rows, mask=mask)
    x = [t.to(torch.bfloat16) if t is not None and t.is_floating_point() else t for t in args]
    with torch.no_grad():
        assert ran_ops(lambda: fastqa.decode_attention(*x, scale=0.7, backend="cpu")) == {"fastqa::decode_attention"}
    check_bf16_against_float64(lambda *a: fastqa.decode_attention(*a, scale=0.7, backend="cpu"),
                               lambda *a: reference.decode_attention(*a, scale=0.7), args,
                               names=["q", "keys", "values", "bias", "mask"], grad_args=[False] * 5, outputs=2)


def test_bfloat16_empty_row_opcheck_and_mixed_dtypes():
    q, keys, values, bias, mask = (t.to(torch.bfloat16) if t.is_floating_point() else t
                                   for t in make_inputs(3, 2, 6, 8, 4, bias=1))
    mask[2] = False
    with torch.no_grad():
        out, weights = fastqa.decode_attention(q, keys, values, bias, mask, backend="cpu")
    assert out.dtype == weights.dtype == torch.bfloat16
    assert not out[2].any() and not weights[2].any()
    torch.library.opcheck(torch.ops.fastqa.decode_attention, (q, keys, values, bias, mask, 0.3))
    with pytest.raises(RuntimeError, match="values must have q's dtype"):
        torch.ops.fastqa.decode_attention(q, keys, values.float(), bias, mask, 1.0)
    with pytest.raises(RuntimeError, match="bias must have q's dtype"):
        torch.ops.fastqa.decode_attention(q, keys, values, bias.float(), mask, 1.0)
