"""self_attention (and the SelfAttention sublayer): the C++ kernel against the SDPA reference."""
from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch

import fastqa
from fastqa import reference
from fastqa._backend import cpu_available, triton_usable_here
from fastqa.layers import SelfAttention

from helpers import check_against_reference, check_bf16_against_float64, device_of, ran_ops

pytestmark = pytest.mark.skipif(not cpu_available(), reason="the kernel is C++ only: needs fastqa._C")

NAMES = ["qkv", "mask", "heads"]

# (B, L, heads, D): QANet's encoder sizes (d 128, 8 heads; context 400, question 50) at a small batch, then edges.
REAL = [(2, 400, 8, 16), (3, 50, 8, 16)]
EDGE = [
    (1, 1, 1, 1),     # one position, one head of one channel
    (2, 7, 3, 5),     # odd lengths, D not a multiple of the vector width
    (3, 9, 2, 24),    # D of three AVX2 vectors (no pair loop for the last)
    (1, 33, 4, 8),    # L one past a multiple of 8 and of the 6-row block
]


def make_inputs(b, length, heads, d, *, dtype=torch.float32, seed=0, fill=0.7):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, length, 3 * heads * d, generator=g, dtype=dtype)
    mask = torch.rand(b, length, generator=g) < fill
    mask[:, 0] = True
    return qkv, mask


def fused(qkv, mask, heads):
    return fastqa.self_attention(qkv, mask, heads, backend="cpu")


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_forward_and_gradient(shape, dtype):
    b, length, heads, d = shape
    qkv, mask = make_inputs(b, length, heads, d, dtype=dtype)
    check_against_reference(fused, reference.self_attention, (qkv, mask, heads), names=NAMES)


def _all_padding_backends():
    return ["reference", "cpu"] + (["triton"] if triton_usable_here() else [])


@pytest.mark.parametrize("backend", _all_padding_backends())
def test_all_padding_sequence_gives_zeros_and_padding_takes_no_part(backend):
    """A row with no real position gives zeros (the package's convention: no NaN, no made-up attention) and no
    gradient, on every backend; padding rows of the other rows give zeros and no gradient either."""
    qkv, mask = make_inputs(3, 20, 2, 8, dtype=torch.float64 if backend != "triton" else torch.float32)
    qkv, mask = qkv.to(device_of(backend)), mask.to(device_of(backend))
    mask[1] = False                       # no real position at all
    mask[2] = torch.arange(20) < 10       # padding after 10 real positions
    x = qkv.clone().requires_grad_()
    out = fastqa.self_attention(x, mask, 2, backend=backend)
    out.backward(torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1)).to(out.device))
    assert torch.equal(out[1], torch.zeros_like(out[1]))              # all padding: zeros
    assert torch.equal(out[2, 10:], torch.zeros_like(out[2, 10:]))   # padded query rows: zeros
    assert torch.equal(x.grad[1], torch.zeros_like(x.grad[1]))       # and no gradient
    padded = x.grad[2, 10:]                   # q, k and v of padding: no gradient
    assert torch.equal(padded, torch.zeros_like(padded))
    assert (out[0][mask[0]] != 0).any(-1).all() and (x.grad[2, :10].abs().sum(-1) > 0).all()
    if backend != "reference":
        check_against_reference(lambda q, m, h: fastqa.self_attention(q, m, h, backend=backend),
                                reference.self_attention, (qkv, mask, 2), names=NAMES)


@pytest.mark.parametrize("backend", _all_padding_backends())
def test_all_padding_segment_gives_zeros(backend):
    """A segment of a packed row with no real position gives zeros and no gradient, the others are unchanged."""
    qkv, mask = make_inputs(2, 12, 2, 4, dtype=torch.float64 if backend != "triton" else torch.float32)
    qkv, mask = qkv.to(device_of(backend)), mask.to(device_of(backend))
    mask[0, 5:9] = False                  # row 0's second segment [5, 9) is all padding
    x = qkv.clone().requires_grad_()
    out = fastqa.self_attention(x, mask, 2, segments=[5, 4, 3], backend=backend)
    out.sum().backward()
    assert torch.equal(out[0, 5:9], torch.zeros_like(out[0, 5:9]))
    assert torch.equal(x.grad[0, 5:9], torch.zeros_like(x.grad[0, 5:9]))
    alone = fastqa.self_attention(qkv[:, 9:], mask[:, 9:], 2, backend=backend)
    torch.testing.assert_close(out[:, 9:].detach(), alone)


def test_reads_any_strides_and_matches_sdpa_layout():
    """A non-contiguous qkv (e.g. a slice of a wider projection) gives the same result as its copy."""
    wide, mask = make_inputs(2, 30, 2, 8)
    qkv = torch.cat([wide, wide[..., :5]], dim=-1)[..., :48]
    assert not qkv.is_contiguous() or qkv.stride(1) != 48
    torch.testing.assert_close(fused(qkv, mask, 2), fused(qkv.contiguous(), mask, 2), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_runs_the_fused_kernel_and_backward_is_thread_count_invariant(dtype):
    qkv, mask = make_inputs(4, 64, 4, 16)
    assert ran_ops(lambda: fused(qkv, mask, 4)) == {"fastqa::self_attention_fwd"}
    code = (
        "import sys, torch, fastqa\n"
        "torch.set_num_threads(int(sys.argv[1]))\n"
        "g = torch.Generator().manual_seed(0)\n"
        f"x = torch.randn(4, 64, 192, generator=g).to(torch.{dtype}).requires_grad_()\n"
        "m = torch.rand(4, 64, generator=g) < 0.7\n"
        "fastqa.self_attention(x, m, 4, backend='cpu').float().pow(2).sum().backward()\n"
        "sys.stdout.buffer.write(x.grad.float().numpy().tobytes())\n")
    outs = [subprocess.run([sys.executable, "-c", code, str(t)], capture_output=True, check=True).stdout
            for t in (1, 2)]
    assert outs[0] == outs[1] and len(outs[0]) == 4 * 64 * 192 * 4


def test_layer_matches_reference_layer_with_the_same_state_dict():
    torch.manual_seed(0)
    ref = reference.SelfAttention(32, 4)
    fast = SelfAttention(32, 4)
    fast.load_state_dict(ref.state_dict())
    assert list(fast.state_dict()) == ["norm.weight", "norm.bias", "qkv.weight", "qkv.bias", "out.weight", "out.bias"]
    x = torch.randn(2, 11, 32)
    mask = torch.arange(11) < torch.tensor([[11], [6]])
    check_against_reference(lambda x, m: fast(x, m), lambda x, m: ref(x, m), (x, mask), names=["x", "mask"])


@pytest.mark.parametrize("segments", [[7, 13], [1, 18, 1], [20]], ids=str)
def test_segments_match_the_reference(segments):
    """segments: every row cut into sequences attended apart, forward and gradient as the reference (which
    attends each piece alone); a piece with no real position gives zeros."""
    qkv, mask = make_inputs(2, 20, 2, 8, dtype=torch.float64)
    mask[:, 5:7] = False
    mask[1, 7:] = False
    check_against_reference(lambda q, m, h: fastqa.self_attention(q, m, h, segments=segments, backend="cpu"),
                            lambda q, m, h: reference.self_attention(q, m, h, segments), (qkv, mask, 2), names=NAMES)


@pytest.mark.parametrize("segments", [None, [5, 4]], ids=str)
def test_opcheck(segments):
    qkv, mask = make_inputs(2, 9, 2, 4)
    torch.library.opcheck(torch.ops.fastqa.self_attention_fwd.default, (qkv.requires_grad_(), mask, 2, segments))


def test_layer_segments_attend_separately():
    """segments cut a row into sequences attended apart (a packed batch): each gives what it gives alone."""
    torch.manual_seed(1)
    layer = SelfAttention(16, 2).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[0, 5:7] = False                                  # the gap after the first sequence
    packed = layer(x, mask, [7, 5])
    first, second = layer(x[:, :5], mask[:, :5]), layer(x[:, 7:], mask[:, 7:])
    torch.testing.assert_close(packed[:, :5], first)
    torch.testing.assert_close(packed[:, 7:], second)
    torch.testing.assert_close(packed[0, 5:7], layer.out.bias.expand(2, 16))  # gap rows: attention gave zeros
    for bad in ([7, 4], [12, 0], [13, -1]):
        with pytest.raises(ValueError, match="segments must be positive int lengths summing to L = 12"):
            layer(x, mask, bad)


@pytest.mark.parametrize("bad, error, match", [
    (lambda qkv, m: (qkv[0], m, 2), ValueError, "qkv must have 3 dimensions"),
    (lambda qkv, m: (qkv, m, 5), ValueError, "qkv's last dimension"),
    (lambda qkv, m: (qkv, m, 0), ValueError, "heads must be a positive int"),
    (lambda qkv, m: (qkv, m, 2.0), ValueError, "heads must be a positive int"),
    (lambda qkv, m: (qkv, m.float(), 2), TypeError, "mask must have dtype torch.bool"),
    (lambda qkv, m: (qkv, m[:, :3], 2), ValueError, "mask must have shape"),
    (lambda qkv, m: (qkv.long(), m, 2), TypeError, "qkv must be a floating-point tensor"),
    (lambda qkv, m: (qkv, m, 2, [4, 1]), ValueError, "segments must be positive int lengths summing to L = 6"),
    (lambda qkv, m: (qkv, m, 2, [6, 0]), ValueError, "segments must be positive int lengths"),
    (lambda qkv, m: (qkv, m, 2, [7, -1]), ValueError, "segments must be positive int lengths"),
    (lambda qkv, m: (qkv, m, 2, [3.0, 3.0]), ValueError, "segments must be positive int lengths"),
    (lambda qkv, m: (qkv, m, 2, [True, 5]), ValueError, "segments must be positive int lengths"),
    (lambda qkv, m: (qkv, m, 2, []), ValueError, "segments must be positive int lengths summing to L = 6"),
    (lambda qkv, m: (qkv, m, 2, 3), TypeError, "segments must be a sequence of int lengths"),
    (lambda qkv, m: (qkv, m, 2, "33"), TypeError, "segments must be a sequence of int lengths"),
    (lambda qkv, m: (qkv, m, 2, torch.tensor([3, 3])), TypeError, "segments must be a sequence of int lengths"),
])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_bad_arguments_name_the_argument(bad, error, match, backend):
    qkv, mask = make_inputs(2, 6, 2, 4)
    args = bad(qkv, mask)
    with pytest.raises(error, match=match):
        fastqa.self_attention(*args[:3], **({"segments": args[3]} if len(args) > 3 else {}), backend=backend)


@pytest.mark.skipif(not triton_usable_here(), reason="the triton backend cannot run here")
def test_triton_backend_is_the_gpu_path():
    """backend="triton" (what "auto" runs on CUDA) is ``packed_attention``: torch's fused attention in one
    call, the reference's values, segments or not (tests/ops/test_gpu_paths.py covers it in depth)."""
    qkv, mask = (t.to(device_of("triton")) for t in make_inputs(2, 9, 2, 4))
    for segments in (None, [4, 5]):
        got = fastqa.self_attention(qkv, mask, 2, segments=segments, backend="triton")
        torch.testing.assert_close(got, reference.self_attention(qkv, mask, 2, segments))
    assert not ran_ops(lambda: fastqa.self_attention(qkv, mask, 2, backend="triton"))


@functools.lru_cache
def _double_backward_inputs():
    return make_inputs(2, 9, 2, 4)


def test_double_backward_raises_the_shared_error():
    qkv, mask = _double_backward_inputs()
    x = qkv.clone().requires_grad_()
    g, = torch.autograd.grad(fused(x, mask, 2).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"fastqa\.self_attention: double backward .* backend='reference'"):
        g.pow(2).sum().backward()


# ------------------------------------------------------------------ bfloat16

# The bf16 kernel's operands are pairs of bf16 values (of channels, of keys, of query rows): an odd D across
# several blocks of 16 keys with an odd number of real ones, a head of exactly one pair, and a head of more than 32
# channels (its rows copied in two masked moves).
BF16_EDGE = [(2, 37, 2, 3), (2, 21, 3, 2), (1, 19, 2, 40)]


@pytest.mark.parametrize("shape", REAL + EDGE + BF16_EDGE, ids=str)
def test_bfloat16_matches_float64_reference(shape):
    """bf16 qkv in, bf16 out and gradient (the kernel's float32 loops inside): against float64 on the same
    rounded values, padding included (make_inputs masks about 30% of the positions)."""
    b, length, heads, d = shape
    qkv, mask = make_inputs(b, length, heads, d)
    check_bf16_against_float64(fused, reference.self_attention, (qkv, mask, heads), names=NAMES)


def test_bfloat16_all_padding_and_segments():
    """A row with no real position, a padded tail, and a packed row whose middle segment is all padding."""
    qkv, mask = make_inputs(3, 20, 2, 8)
    mask[1] = False
    mask[2] = torch.arange(20) < 10
    check_bf16_against_float64(fused, reference.self_attention, (qkv, mask, 2), names=NAMES)
    mask[0, 7:13] = False
    check_bf16_against_float64(lambda q, m, h: fastqa.self_attention(q, m, h, segments=[7, 6, 7], backend="cpu"),
                               lambda q, m, h: reference.self_attention(q, m, h, [7, 6, 7]), (qkv, mask, 2),
                               names=NAMES)
    out = fused(qkv.to(torch.bfloat16), mask, 2)
    assert not out[1].any() and not out[2, 10:].any() and not out[0, 7:13].any()


def test_bfloat16_kernel_keeps_lse_in_float32_and_refuses_mixed_dtypes():
    qkv, mask = make_inputs(2, 9, 2, 4)
    x = qkv.to(torch.bfloat16)
    ops = torch.ops.fastqa
    out, lse = ops.self_attention_fwd(x, mask, 2)
    assert (out.dtype, lse.dtype) == (torch.bfloat16, torch.float32)
    assert ops.self_attention_bwd(torch.ones_like(out), x, mask, out, lse, 2).dtype == torch.bfloat16
    torch.library.opcheck(ops.self_attention_fwd.default, (x.clone().requires_grad_(), mask, 2, None))
    with pytest.raises(RuntimeError, match="grad_out and out"):
        ops.self_attention_bwd(torch.ones(out.shape), x, mask, out, lse, 2)
    with pytest.raises(RuntimeError, match="lse"):
        ops.self_attention_bwd(torch.ones_like(out), x, mask, out, lse.to(torch.bfloat16), 2)
