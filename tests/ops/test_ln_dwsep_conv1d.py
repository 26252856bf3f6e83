"""fastqa.ln_dwsep_conv1d and layers.LayerNormDepthwiseSeparableConv1d (pre-LayerNorm + depthwise-separable
conv: QANet's conv sublayer) against the pure-PyTorch reference.

The Triton backend runs in the interpreter here (conftest sets TRITON_INTERPRET=1 without a GPU), so
every shape is small; tests/ops/test_triton_dwsep_conv1d.py covers the kernels themselves in depth.
"""
from __future__ import annotations

import pytest
import torch

import fastqa
from fastqa import reference
from fastqa._backend import cpu_available
from fastqa.reference.dwsep_conv1d import conv_padding
from helpers import (as_leaves, assert_close, check_against_reference, check_bf16_against_float64, compiled_backends,
                     num_threads, padding_mask, row_strided)

pytestmark = pytest.mark.skipif(not cpu_available(), reason="fastqa._C is not built")


BACKENDS = compiled_backends()
NAMES = ["x", "ln_weight", "ln_bias", "dw_weight", "pw_weight", "pw_bias", "dw_bias", "residual"]


def make_inputs(B, L, c_in, c_out, K, *, dw_bias=True, pw_bias=True, residual=True, dtype=torch.float32, seed=0):
    """Positional args in NAMES order (absent optionals are None). The LayerNorm affine parameters are
    away from (1, 0) so that their gradients and effect are visible."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)

    return [rand(B, L, c_in, scale=2.0, shift=0.5), rand(c_in, scale=0.3, shift=1.0), rand(c_in, scale=0.3),
            rand(c_in, 1, K, scale=K ** -0.5), rand(c_out, c_in, 1, scale=c_in ** -0.5),
            rand(c_out) if pw_bias else None, rand(c_in) if dw_bias else None,
            rand(B, L, c_out) if residual else None]


def fused(backend):
    def fn(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, residual, **kw):
        return fastqa.ln_dwsep_conv1d(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias,
                                      residual=residual, backend=backend, **kw)
    return fn


def ref(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, residual, **kw):
    return reference.ln_dwsep_conv1d(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias,
                                     residual=residual, **kw)


def compare(backend, args, **kw):
    check_against_reference(fused(backend), ref, args, kw, names=NAMES, grad_args=[a is not None for a in args])


# --- forward and every gradient against the reference -------------------------------------------------------

def test_reference_is_layer_norm_then_dwsep():
    x, lnw, lnb, dw, pw, pb, db, res = make_inputs(2, 7, 5, 4, 3)
    h = torch.nn.functional.layer_norm(x, (5,), lnw, lnb, 1e-3)
    want = reference.dwsep_conv1d(h, dw, pw, pb, dw_bias=db, padding="causal", activation="relu", residual=res)
    got = reference.ln_dwsep_conv1d(x, lnw, lnb, dw, pw, pb, dw_bias=db, eps=1e-3, padding="causal",
                                    activation="relu", residual=res)
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("B, L, c_in, c_out, K, padding, activation", [
    (2, 33, 24, 20, 5, "same", "relu"),
    (1, 3, 5, 6, 7, "causal", "relu"),    # length < K
    (2, 9, 12, 7, 1, "same", None),       # K = 1
    (1, 8, 6, 6, 4, "same", "relu"),      # even K
])
def test_matches_reference(backend, B, L, c_in, c_out, K, padding, activation):
    args = make_inputs(B, L, c_in, c_out, K)
    compare(backend, args, padding=padding, activation=activation)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_optionals(backend):
    args = make_inputs(2, 10, 6, 5, 3, dw_bias=False, pw_bias=False, residual=False)
    compare(backend, args, padding="causal", eps=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_first_view_and_residual_is_x(backend):
    """x as a transposed view of channels-first data, and QANet's residual=x (x gets both gradients)."""
    B, L, C, K = 2, 21, 12, 5
    _, lnw, lnb, dw, _, _, db, _ = make_inputs(B, L, C, C, K)
    pw, pb = torch.randn(C, C, 1) * C ** -0.5, torch.randn(C)
    x = torch.randn(B, C, L).transpose(1, 2)
    assert not x.is_contiguous()

    def sublayer(fn):
        return lambda x, lnw, lnb, dw, pw, pb, db, **kw: fn(x, lnw, lnb, dw, pw, pb, db, x, **kw)

    check_against_reference(sublayer(fused(backend)), sublayer(ref), [x, lnw, lnb, dw, pw, pb, db],
                            {"activation": "relu"}, names=NAMES[:7])


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_gradient_untouched_and_residual_grad(backend):
    leaves = as_leaves(make_inputs(2, 11, 6, 6, 3))
    y = fused(backend)(*leaves, activation="relu")
    grad = torch.randn(6, 11, 2).permute(2, 1, 0)  # non-contiguous upstream gradient
    before = grad.clone()
    y.backward(grad)
    assert torch.equal(grad, before), "the incoming gradient was modified"
    assert_close(leaves[7].grad, before, name="grad of residual")
    assert all(t.grad is not None for t in leaves)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_some_inputs_need_grad(backend):
    args = make_inputs(2, 10, 6, 5, 3)
    for wanted in ([True] + [False] * 7, [False, True, True] + [False] * 5, [False] * 3 + [True] * 4 + [False],
                   [False] * 7 + [True]):
        check_against_reference(fused(backend), ref, args, {"activation": "relu"}, names=NAMES, grad_args=wanted)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("padding, activation", [("same", "relu"), ("causal", None)])
def test_mask_matches_reference(backend, padding, activation):
    args = make_inputs(3, 19, 12, 10, 5)
    compare(backend, args, padding=padding, activation=activation, mask=padding_mask(3, 19))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_makes_real_rows_independent_of_padding(backend):
    """A sequence padded in a batch gives, at its real rows, what it gives alone; the padded rows of x
    get no gradient from the conv (only the residual's)."""
    B, L, n, C, K = 2, 16, 9, 8, 5
    x, lnw, lnb, dw, pw, pb, db, _ = make_inputs(B, L, C, C, K)
    mask = torch.arange(L).unsqueeze(0) < torch.tensor([[n], [L]])
    x = x.clone().requires_grad_()
    y = fused(backend)(x, lnw, lnb, dw, pw, pb, db, None, activation="relu", mask=mask)
    alone = fused(backend)(x[:1, :n].detach(), lnw, lnb, dw, pw, pb, db, None, activation="relu")
    assert_close(y[:1, :n], alone, name="real rows, padded vs alone")
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad[0, n:], torch.zeros_like(x.grad[0, n:])), "padded rows got a gradient"


@pytest.mark.parametrize("backend, dtype", [(b, torch.float32) for b in BACKENDS] + [("cpu", torch.float64)])
@pytest.mark.parametrize("c_in", [8, 96])
def test_constant_rows_with_a_tiny_eps_are_exact(backend, dtype, c_in):
    """Rows of one value (c_in 96: a sum that rounds), eps = 1e-12: LN(x) is exactly ln_bias there, 1/std
    exactly 1/sqrt(eps), and the output and every gradient equal the exact ones -- the row statistics are
    taken on the row shifted by its first value, so the mean is exact and the variance 0. (A mean off by
    one rounding gave a variance of ~1e-11 in place of 0: grad x rescaled, or x - mean normalised to +-1.)

    The judge is a float64 LayerNorm written out with that shift, under autograd, then the reference dwsep:
    torch's own layer_norm backward cancels terms of rstd^3 * x here, returning 0 or multiples of 65536 in
    float32 and 1e-9 relative errors in float64, so neither same-dtype reference can tell right from wrong."""
    B, L, c_out, K = 2, 6, 5, 3
    args = make_inputs(B, L, c_in, c_out, K, dtype=dtype, seed=7)
    x = args[0].clone()
    for row, value in zip(range(L), [0.1, -123.456, 1e6, 3.7, 0.0, 1000.0]):
        x[0, row] = value                     # batch row 0: constant rows; batch row 1: ordinary ones
    args[0] = x
    grad_y = torch.randn(B, L, c_out, dtype=dtype, generator=torch.Generator().manual_seed(8))
    leaves = as_leaves(args)
    y = fused(backend)(*leaves, eps=1e-12)
    y.backward(grad_y)
    leaves64 = as_leaves([None if t is None else t.double() for t in args])
    x64, ln_w, ln_b, dw_w, pw_w, pw_b, dw_b, res = leaves64
    shifted = x64 - x64[..., :1].detach()
    centred = shifted - shifted.mean(-1, keepdim=True)
    h = centred * (centred.square().mean(-1, keepdim=True) + 1e-12).rsqrt() * ln_w + ln_b
    y64 = reference.dwsep_conv1d(h, dw_w, pw_w, pw_b, dw_bias=dw_b, residual=res)
    y64.backward(grad_y.double())
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for name, got, want in zip(["y", *NAMES], [y, *(t.grad for t in leaves)], [y64, *(t.grad for t in leaves64)]):
        if want is None:
            continue
        scale = max(1.0, want.abs().max().item())
        assert (got.double() - want).abs().max().item() <= tol * scale, name
    assert torch.equal(centred[0], torch.zeros_like(centred[0])), "the judge's constant rows centre to exact zeros"


def test_gradcheck_float64_cpu_mask():
    leaves = as_leaves(make_inputs(3, 7, 3, 4, 3, dtype=torch.float64))
    mask = padding_mask(3, 7)
    assert torch.autograd.gradcheck(lambda *t: fused("cpu")(*t, activation="relu", mask=mask), leaves)


@pytest.mark.parametrize("padding, activation", [("same", "relu"), ("causal", None)])
def test_gradcheck_float64_cpu(padding, activation):
    leaves = as_leaves(make_inputs(2, 6, 3, 4, 3, dtype=torch.float64))
    assert torch.autograd.gradcheck(
        lambda *t: fused("cpu")(*t, padding=padding, activation=activation, eps=1e-3), leaves)


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton kernels not registered here")
def test_backward_bit_identical_triton():
    args = make_inputs(2, 40, 24, 16, 7)
    grad = torch.randn(2, 40, 16)
    runs = []
    for _ in range(2):
        leaves = as_leaves(args)
        y = fused("triton")(*leaves, activation="relu")
        runs.append([y] + list(torch.autograd.grad(y, leaves, grad)))
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"run-to-run difference in output/grad {i}"


@pytest.mark.parametrize("backend", ["reference"] + (["triton"] if "triton" in BACKENDS else []))
def test_autocast(backend):
    args = make_inputs(2, 9, 8, 6, 3)
    want = fused("reference")(*args, activation="relu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fused(backend)(*args, activation="relu")
    assert got.dtype == torch.bfloat16, "autocast ignored"
    assert_close(got.float(), want, name="autocast", atol=0.15, rtol=0.05)


# --- bfloat16 (the CPU kernel: float32 inside, statistics saved in float32, products on the bf16 GEMM) ---------

def ref_under_kernel_mask(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, residual, *, padding="same",
                          activation=None, eps=1e-5, mask=None):
    """The float64 reference with its ReLU taken where the bf16 kernel's own forward kept the value (a
    pre-activation within bf16 rounding of 0 may land on either side, and its gradient with it)."""
    y = ref(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, None, padding=padding, eps=eps, mask=mask)
    if activation == "relu":
        low = [None if t is None else t.detach().to(torch.bfloat16)
               for t in (x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias)]
        pad_left, _ = conv_padding(dw_weight.shape[-1], padding)
        _, kept, _ = torch.ops.fastqa.ln_dwsep_conv1d_fwd(*low[:3], eps, *low[3:], None, mask, pad_left, True)
        y = torch.where(kept, y, 0.0)
    return y if residual is None else y + residual


@pytest.mark.parametrize("B, L, c_in, c_out, K", [
    (2, 400, 128, 128, 7),   # QANet's encoder conv sublayer, context side
    (2, 50, 128, 128, 7),    # question side
    (2, 33, 24, 20, 5),
    (1, 3, 5, 6, 7),         # length < K
    (2, 9, 12, 7, 1),        # K = 1
    (1, 8, 6, 6, 4),         # even K
    (1, 300, 600, 40, 7),    # wide channels: sequences split into tiles
], ids=str)
@pytest.mark.parametrize("padding, activation, optionals", [("same", "relu", True), ("causal", None, False)],
                         ids=["same-relu-optionals", "causal-plain"])
def test_bfloat16_matches_float64_reference(B, L, c_in, c_out, K, padding, activation, optionals):
    """bf16 in and out: forward and every gradient (LayerNorm's included) against float64."""
    args = make_inputs(B, L, c_in, c_out, K, dw_bias=optionals, pw_bias=optionals, residual=optionals)
    check_bf16_against_float64(fused("cpu"), ref_under_kernel_mask, args, {"padding": padding, "activation": activation},
                               names=NAMES, grad_args=[a is not None for a in args])


@pytest.mark.parametrize("activation", ["relu", None])
def test_bfloat16_sublayer_with_mask(activation):
    """QANet's use: channels-first data as a view, residual = x, a padding mask (eps as the model's)."""
    B, L, C, K = 2, 45, 16, 7
    _, lnw, lnb, dw, _, _, db, _ = make_inputs(B, L, C, C, K)
    g = torch.Generator().manual_seed(4)
    pw, pb = torch.randn(C, C, 1, generator=g) * C ** -0.5, torch.randn(C, generator=g)
    x = torch.randn(B, C, L, generator=g).transpose(1, 2)
    mask = padding_mask(B, L)

    def sublayer(fn):
        return lambda x, lnw, lnb, dw, pw, pb, db, **kw: fn(x, lnw, lnb, dw, pw, pb, db, x, **kw)

    check_bf16_against_float64(sublayer(fused("cpu")), sublayer(ref_under_kernel_mask), [x, lnw, lnb, dw, pw, pb, db],
                               {"activation": activation, "mask": mask, "eps": 1e-6}, names=NAMES[:7])


def test_bfloat16_statistics_stay_float32():
    """The saved row statistics are float32 (what they are computed in); a bf16 copy of them is refused, as
    are float32 x with bf16 LayerNorm parameters."""
    x, lnw, lnb, dw, pw, pb, db, res = (t.to(torch.bfloat16) for t in make_inputs(2, 8, 6, 4, 3))
    y, aux, stats = torch.ops.fastqa.ln_dwsep_conv1d_fwd(x, lnw, lnb, 1e-5, dw, db, pw, pb, res, None, 1, True)
    assert y.dtype == torch.bfloat16 and aux.dtype == torch.bool and stats.dtype == torch.float32
    mean = x.float().mean(-1)
    assert_close(stats[:, 0], mean, name="row means", atol=1e-6, rtol=1e-6)
    grad_y = torch.randn(2, 8, 4).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="ln_stats"):
        torch.ops.fastqa.ln_dwsep_conv1d_bwd(grad_y, x, lnw, lnb, dw, db, pw, pb, aux, stats.to(torch.bfloat16),
                                             None, 1, True)
    with pytest.raises(RuntimeError, match="ln_weight"):
        torch.ops.fastqa.ln_dwsep_conv1d_fwd(x.float(), lnw, lnb.float(), 1e-5, dw.float(), db.float(), pw.float(),
                                             pb.float(), res.float(), None, 1, True)


def test_bfloat16_with_float32_parameters_opcheck():
    """bf16 activations with float32 parameters (the master weights under autocast): the outputs as with bf16
    parameters, the parameters' gradients float32 -- what the fake kernels declare too -- and close to those of
    the bf16 parameters' call, widened."""
    x, lnw, lnb, dw, pw, pb, db, res = make_inputs(2, 9, 6, 5, 3)
    low = x.to(torch.bfloat16), res.to(torch.bfloat16)
    mask = padding_mask(2, 9)
    fwd_args = (low[0], lnw, lnb, 1e-5, dw, db, pw, pb, low[1], mask, 1, True)
    torch.library.opcheck(torch.ops.fastqa.ln_dwsep_conv1d_fwd, fwd_args)
    y, aux, stats = torch.ops.fastqa.ln_dwsep_conv1d_fwd(*fwd_args)
    params16 = [t.to(torch.bfloat16) for t in (lnw, lnb, dw, db, pw, pb)]
    y16 = torch.ops.fastqa.ln_dwsep_conv1d_fwd(low[0], *params16[:2], 1e-5, *params16[2:], low[1], mask, 1, True)[0]
    assert y.dtype == torch.bfloat16
    assert_close(y.float(), y16.float(), name="y", atol=5e-2, rtol=5e-2)
    grad_y = torch.randn(2, 9, 5).to(torch.bfloat16)
    bwd_args = (grad_y, low[0], lnw, lnb, dw, db, pw, pb, aux, stats, mask, 1, True)
    torch.library.opcheck(torch.ops.fastqa.ln_dwsep_conv1d_bwd, bwd_args)
    grads = torch.ops.fastqa.ln_dwsep_conv1d_bwd(*bwd_args)
    assert grads[0].dtype == torch.bfloat16 and all(g.dtype == torch.float32 for g in grads[1:])


def test_bfloat16_opcheck():
    """The fake kernels give the bf16 outputs' dtypes: y bf16, the mask bool, ln_stats float32."""
    x, lnw, lnb, dw, pw, pb, db, res = (t.to(torch.bfloat16) for t in make_inputs(2, 9, 6, 5, 3))
    mask = padding_mask(2, 9)
    fwd_args = (x, lnw, lnb, 1e-5, dw, db, pw, pb, res, mask, 1, True)
    torch.library.opcheck(torch.ops.fastqa.ln_dwsep_conv1d_fwd, fwd_args)
    _, aux, stats = torch.ops.fastqa.ln_dwsep_conv1d_fwd(*fwd_args)
    grad_y = torch.randn(2, 9, 5).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.fastqa.ln_dwsep_conv1d_bwd,
                          (grad_y, x, lnw, lnb, dw, db, pw, pb, aux, stats, mask, 1, True))


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("B, L, C, K, padding", [(1, 301, 24, 5, "causal"), (3, 37, 16, 7, "same")], ids=str)
@pytest.mark.parametrize("residual_is_x", [False, True], ids=["residual", "residual_is_x"])
def test_bfloat16_row_strided_views_on_both_routes(monkeypatch, route, B, L, C, K, padding, residual_is_x):
    """bf16 x and residual as slices with a row stride of their own (the LayerNorm reads bf16 rows one at a time,
    the conv its residual's as it adds them), the residual a tensor of its own or x itself, with a padding mask,
    on each forced route: forward and every gradient against float64."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    args = make_inputs(B, L, C, C, K, residual=not residual_is_x)

    def on_views(fn):
        def run(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, residual, **kw):
            x = row_strided(x)
            return fn(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias,
                      x if residual_is_x else row_strided(residual), **kw)
        return run

    check_bf16_against_float64(on_views(fused("cpu")), on_views(ref_under_kernel_mask), args,
                               {"padding": padding, "activation": "relu", "mask": padding_mask(B, L)}, names=NAMES,
                               grad_args=[a is not None for a in args])


@pytest.mark.parametrize("route", ["native", "widen"])
def test_bfloat16_bit_identical_across_thread_counts(monkeypatch, route):
    """On either route (forced: the automatic choice is measured per thread count) the forward and the backward
    give the same bits on 1 thread as on all: the LayerNorm parameter gradients too are reduced in fixed row
    blocks. x, the residual and grad_y are bf16 row-strided views."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    B, L, c_in, c_out, K = 2, 300, 96, 128, 7
    x, lnw, lnb, dw, pw, pb, db, residual = (
        None if t is None else t.to(torch.bfloat16) for t in make_inputs(B, L, c_in, c_out, K))
    x, residual = row_strided(x), row_strided(residual)
    grad_y = row_strided(torch.randn(B, L, c_out, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16))
    mask = padding_mask(B, L)
    runs = []
    for threads in (1, max(2, torch.get_num_threads())):
        with num_threads(threads):
            y, aux, stats = torch.ops.fastqa.ln_dwsep_conv1d_fwd(x, lnw, lnb, 1e-5, dw, db, pw, pb, residual, mask, 3,
                                                                 True)
            runs.append((y, aux, stats, *torch.ops.fastqa.ln_dwsep_conv1d_bwd(grad_y, x, lnw, lnb, dw, db, pw, pb,
                                                                              aux, stats, mask, 3, True)))
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"output {i} (y, aux, ln_stats, then the gradients) depends on the thread count"


# --- layer, compile ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    """aot_eager: traces the autograd Functions and the fake kernels without the slow inductor codegen."""
    torch.manual_seed(0)
    layer = fastqa.layers.LayerNormDepthwiseSeparableConv1d(12, 12, 5, activation="relu", depthwise_bias=True,
                                                            backend=backend)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 17, 12, requires_grad=True)
    outs = []
    for fn in (layer, compiled):
        layer.zero_grad()
        x.grad = None
        y = fn(x, x)  # residual = x, as in QANet
        y.square().sum().backward()
        outs.append([y.detach(), x.grad] + [p.grad for p in layer.parameters()])
    assert len(outs[0]) == 2 + 6  # y, x and norm / depthwise / pointwise weights and biases
    for i, (got, want) in enumerate(zip(outs[1], outs[0])):
        assert_close(got, want, name=f"compiled output/grad {i}")


@pytest.mark.parametrize("backend", ["auto", "reference", "cpu"])
def test_layer_backends(backend):
    layer = fastqa.layers.LayerNormDepthwiseSeparableConv1d(6, 4, 3, padding="causal", backend=backend)
    x = torch.randn(2, 8, 6)
    want = reference.LayerNormDepthwiseSeparableConv1d.forward(layer, x)
    assert_close(layer(x), want, name=f"layer {backend}")
    assert f"backend={backend!r}" in repr(layer)


# --- bad input -----------------------------------------------------------------------------------------------

def _call(**change):
    x, lnw, lnb, dw, pw, pb, db, res = make_inputs(2, 8, 6, 4, 3)
    kw = {**dict(x=x, ln_weight=lnw, ln_bias=lnb, dw_weight=dw, pw_weight=pw, pw_bias=pb, dw_bias=db,
                 residual=res, backend="cpu"), **change}
    return fastqa.ln_dwsep_conv1d(kw.pop("x"), kw.pop("ln_weight"), kw.pop("ln_bias"), kw.pop("dw_weight"),
                                  kw.pop("pw_weight"), kw.pop("pw_bias"), **kw)


@pytest.mark.parametrize("name, exc, change", [
    ("ln_weight", ValueError, lambda: dict(ln_weight=torch.ones(5))),
    ("ln_weight", ValueError, lambda: dict(ln_weight=torch.ones(6, 1))),
    ("ln_bias", ValueError, lambda: dict(ln_bias=torch.zeros(7))),
    ("ln_bias", TypeError, lambda: dict(ln_bias=torch.zeros(6, dtype=torch.float64))),
    ("eps", ValueError, lambda: dict(eps=0.0)),
    ("eps", ValueError, lambda: dict(eps=-1e-5)),
    ("eps", TypeError, lambda: dict(eps="1e-5")),
    ("dw_weight", ValueError, lambda: dict(dw_weight=torch.randn(5, 1, 3))),  # the shared dwsep checks
    ("residual", ValueError, lambda: dict(residual=torch.randn(2, 8, 3))),
    ("x", ValueError, lambda: dict(x=torch.randn(0, 8, 6))),
    ("activation", ValueError, lambda: dict(activation="gelu")),
    ("mask", ValueError, lambda: dict(mask=torch.ones(2, 7, dtype=torch.bool))),
    ("mask", TypeError, lambda: dict(mask=torch.ones(2, 8))),
])
def test_bad_arguments(name, exc, change):
    with pytest.raises(exc, match=name):
        _call(**change())
