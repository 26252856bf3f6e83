"""fastqa.glu_conv1d / glu_conv1d_step / layers.GLUConv1d against the pure-PyTorch reference."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch
from helpers import (TOLERANCES, assert_close, check_against_reference, check_bf16_against_float64, compiled_backends,
                     device_of, interpreted, kernel_ops, ran_kernels)

import fastqa
from fastqa import reference
from fastqa.layers import GLUConv1d

BACKENDS = compiled_backends()
# Under the Triton interpreter (no GPU) each program runs in Python: the real model widths and the
# slowest sweeps run on CUDA only, the interpreter gets a subset (marked by `interpreted`).
BIG_BACKENDS = ["cpu"] + (["triton"] if "triton" in BACKENDS and torch.cuda.is_available() else [])


def make(batch: int, length: int, channels: int, k: int, *, dtype=torch.float32, device="cpu", bias=True, seed=0):
    """x [B, T, H], weight [2H, H, K] (nn.Conv1d-like scale), bias [2H] or None."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, channels, generator=g, dtype=dtype)
    w = torch.randn(2 * channels, channels, k, generator=g, dtype=dtype) / (channels * k) ** 0.5
    b = torch.randn(2 * channels, generator=g, dtype=dtype) if bias else None
    return x.to(device), w.to(device), None if b is None else b.to(device)


def random_mask(batch: int, length: int, device="cpu", seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, length, generator=g) > 0.3
    mask[0, :] = False  # an all-padded sequence
    if length > 1:
        mask[:, length // 2] = False  # a position padded in every sequence
    return mask.to(device)


def compare(backend, x, w, b, **kwargs):
    fn = functools.partial(fastqa.glu_conv1d, backend=backend)
    args, names = ((x, w, b), ["x", "weight", "bias"]) if b is not None else ((x, w), ["x", "weight"])
    check_against_reference(fn, reference.glu_conv1d, args, kwargs, names=names)


# (batch, length, channels, kernel size): real ConvS2S width/kernel, then the edge shapes.
REAL = [(2, 50, 512, 3), (3, 37, 256, 5)]
EDGE = [(2, 1, 16, 3), (2, 2, 12, 5), (3, 9, 16, 1), (1, 13, 13, 3), (4, 7, 20, 7), (2, 3, 9, 3)]


@pytest.mark.parametrize("backend", BIG_BACKENDS)
@pytest.mark.parametrize("shape", REAL, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_real_shapes(backend, shape, causal):
    x, w, b = make(*shape, device=device_of(backend))
    compare(backend, x, w, b, causal=causal)
    compare(backend, x, w, b, causal=causal, mask=random_mask(*shape[:2], device=x.device))


@pytest.mark.parametrize("backend,shape", [(b, s) for b in BACKENDS for s in EDGE
                                           if not (interpreted(b) and s[3] > 5)], ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_edge_shapes(backend, shape, causal, masked):
    x, w, b = make(*shape, device=device_of(backend))
    mask = random_mask(*shape[:2], device=x.device) if masked else None
    compare(backend, x, w, b, causal=causal, mask=mask)


@pytest.mark.parametrize("backend,bias", [(b, bias) for b in BACKENDS for bias in (True, False)
                                          if bias or not interpreted(b)])
@pytest.mark.parametrize("residual,scale", [(False, 1.0), (True, 0.25), (False, 0.5 ** 0.5)])
def test_residual_scale_bias(backend, bias, residual, scale):
    x, w, b = make(3, 11, 24, 3, device=device_of(backend), bias=bias)
    compare(backend, x, w, b, causal=True, residual=residual, scale=scale,
            mask=random_mask(3, 11, device=x.device))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_strided_inputs(backend, causal):
    """Channels-first data as a transposed view, a sliced time axis, a non-contiguous weight and mask."""
    dev = device_of(backend)
    x, w, b = make(2, 15, 24, 3, device=dev)
    channels_first = x.transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, H] view of [B, H, T] memory
    assert not channels_first.is_contiguous()
    compare(backend, channels_first, w, b, causal=causal, mask=random_mask(2, 15, device=dev))
    every_other = torch.randn(2, 30, 24, device=dev)[:, ::2]
    w_strided = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    mask_strided = random_mask(15, 2, device=dev).t()
    compare(backend, every_other, w_strided, b, causal=causal, mask=mask_strided)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_masked_is_finite(backend):
    """A fully padded batch: the conv sees only zeros; outputs and gradients stay finite."""
    x, w, b = make(2, 6, 8, 3, device=device_of(backend))
    mask = torch.zeros(2, 6, dtype=torch.bool, device=x.device)
    compare(backend, x, w, b, causal=False, mask=mask)
    x.requires_grad_()
    y = fastqa.glu_conv1d(x, w, b, causal=True, mask=mask, residual=False, backend=backend)
    # With every position padded the conv input is zero: y = GLU(bias)·scale at every position.
    expected = torch.nn.functional.glu(b, dim=0) * 0.5 ** 0.5
    assert_close(y, expected.expand_as(y), name="all-masked output")
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(grad).all() and not grad.any()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck(causal, masked):
    x, w, b = make(2, 5, 4, 3, dtype=torch.float64)
    mask = random_mask(2, 5) if masked else None
    fn = functools.partial(fastqa.glu_conv1d, causal=causal, mask=mask, backend="cpu")
    assert torch.autograd.gradcheck(fn, (x.requires_grad_(), w.requires_grad_(), b.requires_grad_()))


def test_gradcheck_no_bias_no_residual():
    x, w, _ = make(3, 4, 3, 2, dtype=torch.float64, bias=False)
    fn = functools.partial(fastqa.glu_conv1d, causal=True, residual=False, scale=1.0, backend="cpu")
    assert torch.autograd.gradcheck(fn, (x.requires_grad_(), w.requires_grad_()))


# The CPU kernel's two ways to run the K taps (FASTQA_CPU_GLU_CONV): "taps" (K GEMMs) and "winograd"
# (F(9 - K, K) for 2 <= K <= 7; other K fall back to the taps). Every K from 1 to 8, masked and not,
# both directions, float32 and float64.
ALGO_SHAPES = [(2, 50, 64, k) for k in range(1, 9)] + [(3, 5, 16, 3), (1, 1, 8, 5), (2, 40, 512, 3)]


@pytest.mark.skipif("cpu" not in BACKENDS, reason="fastqa._C is not built")
@pytest.mark.parametrize("algo", ["taps", "winograd"])
@pytest.mark.parametrize("shape", ALGO_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cpu_conv_algorithms_match_reference(monkeypatch, algo, shape, dtype):
    monkeypatch.setenv("FASTQA_CPU_GLU_CONV", algo)
    x, w, b = make(*shape, dtype=dtype)
    for causal in (True, False) if shape[3] % 2 else (True,):  # centred padding needs an odd K
        compare("cpu", x, w, b, causal=causal, residual=True, scale=0.5 ** 0.5)
        compare("cpu", x, w, b, causal=causal, mask=random_mask(*shape[:2]))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="fastqa._C is not built")
def test_cpu_conv_algorithm_variable_takes_effect(monkeypatch):
    """The two algorithms round differently (so the variable reaches the kernel), and a bad value names
    the variable and the values it takes."""
    x, w, b = make(2, 40, 64, 3)
    outs = {}
    for algo in ("taps", "winograd"):
        monkeypatch.setenv("FASTQA_CPU_GLU_CONV", algo)
        outs[algo] = fastqa.glu_conv1d(x, w, b, causal=True, backend="cpu")
        assert fastqa.info()["cpu_extension"]["glu_conv"] == algo
    assert not torch.equal(outs["taps"], outs["winograd"])
    assert_close(outs["winograd"], outs["taps"], name="winograd vs taps")
    monkeypatch.setenv("FASTQA_CPU_GLU_CONV", "fastest")
    with pytest.raises(RuntimeError, match="FASTQA_CPU_GLU_CONV must be auto, winograd or taps"):
        fastqa.glu_conv1d(x, w, b, causal=True, backend="cpu")


def _glu_and_grads(x, w, b, grad_y, backend, **kwargs):
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = fastqa.glu_conv1d(*leaves, backend=backend, **kwargs)
    y.backward(grad_y)
    return [y.detach()] + [t.grad for t in leaves]


@pytest.mark.skipif("cpu" not in BACKENDS, reason="fastqa._C is not built")
@pytest.mark.parametrize("algo", ["auto", "winograd"])
@pytest.mark.parametrize("k, causal, masked", [(3, True, False), (5, False, True), (2, True, False), (7, False, False)],
                         ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", ["one_position_at_1e30", "grad_spike_1e30", "one_position_at_1e4"])
def test_cpu_mixed_magnitudes_match_reference(monkeypatch, algo, k, causal, masked, dtype, case):
    """Values of very different magnitudes in one tensor (a position at 1e30 among O(1) ones, or one output
    gradient at 1e30): output and every gradient as the same-dtype reference. Winograd's transforms mix the
    rows of a tile, so there the small outputs next to a huge row lost every digit (grad x off by ~1e20
    where the reference gives O(1)); such operands now take the direct taps, whatever the variable asks."""
    monkeypatch.setenv("FASTQA_CPU_GLU_CONV", algo)
    x, w, b = make(2, 40, 16, k, dtype=dtype, seed=3)
    grad_y = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    if case == "one_position_at_1e30":
        x[0, 11] *= 1e30
    elif case == "one_position_at_1e4":
        x[1, 23] *= 1e4
    else:
        grad_y[1, 17] *= 1e30
    mask = random_mask(2, 40) if masked else None
    got = _glu_and_grads(x, w, b, grad_y, "cpu", causal=causal, mask=mask)
    want = _glu_and_grads(x, w, b, grad_y, "reference", causal=causal, mask=mask)
    for name, g, r in zip(["y", "grad x", "grad weight", "grad bias"], got, want):
        assert torch.isfinite(r).all(), name
        assert_close(g, r, name=name)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="fastqa._C is not built")
@pytest.mark.parametrize("scale", [1.0, 1e30], ids=["normal_scale", "everything_times_1e30"])
def test_cpu_winograd_still_runs_on_rows_of_one_magnitude(monkeypatch, scale):
    """Rows of about one magnitude, at any scale, keep the Winograd path (auto gives exactly what a forced
    "winograd" gives, not what the taps give: the values of normal-scale inputs are unchanged) and match
    the reference to the dtype's tolerance, relative to the values' scale."""
    x, w, b = make(2, 40, 64, 3)
    x = x * scale
    grad_y = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    runs = {}
    for algo in ("auto", "winograd", "taps"):
        monkeypatch.setenv("FASTQA_CPU_GLU_CONV", algo)
        runs[algo] = _glu_and_grads(x, w, b, grad_y, "cpu", causal=True)
    want = _glu_and_grads(x, w, b, grad_y, "reference", causal=True)
    for i, name in enumerate(["y", "grad x", "grad weight", "grad bias"]):
        assert torch.equal(runs["auto"][i], runs["winograd"][i]), name
        if name != "grad bias":  # the bias gradient is no contraction: the same in both
            assert not torch.equal(runs["winograd"][i], runs["taps"][i]), name
        atol, rtol = TOLERANCES["same dtype"][torch.float32]
        assert_close(runs["auto"][i], want[i], name=name, atol=atol * max(1.0, want[i].abs().max().item()), rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_needed_gradients(backend):
    x, w, b = make(2, 7, 8, 3, device=device_of(backend))
    w.requires_grad_()
    y = fastqa.glu_conv1d(x, w, b, causal=True, backend=backend)
    (gw,) = torch.autograd.grad(y.sum(), w)
    y_ref = reference.glu_conv1d(x, w, b, causal=True)
    (gw_ref,) = torch.autograd.grad(y_ref.sum(), w)
    assert_close(gw, gw_ref, name="grad of weight")


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    dev = device_of(backend)
    x, w, b = make(2, 6, 8, 3, device=dev)
    mask = random_mask(2, 6, device=dev)
    fwd = kernel_ops(backend).glu_conv1d_fwd
    bwd = kernel_ops(backend).glu_conv1d_bwd
    step = kernel_ops(backend).glu_conv1d_step
    for bias, m, pad_left, residual in [(b, mask, 1, True), (None, None, 2, False)]:
        torch.library.opcheck(fwd, (x, w, bias, m, pad_left, residual, 0.7))
        _, aux = fwd(x, w, bias, m, pad_left, residual, 0.7)
        torch.library.opcheck(bwd, (torch.randn_like(x), x, w, m, aux, pad_left, residual, 0.7, bias is not None))
        grad_bias = bwd(torch.randn_like(x), x, w, m, aux, pad_left, residual, 0.7, bias is not None)[2]
        assert (grad_bias is None) == (bias is None)   # no placeholder for an absent bias
    torch.library.opcheck(step, (x[:, 0], x[:, 1:3], w, b, True, 0.7))
    torch.library.opcheck(step, (x[:, 0], x[:, 1:3], w, None, False, 1.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    """Forward + backward of the layer under torch.compile(fullgraph=True, backend="aot_eager")."""
    dev = device_of(backend)
    torch.manual_seed(0)
    layer = GLUConv1d(16, 3, causal=False, backend=backend).to(dev)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 9, 16, device=dev, requires_grad=True)
    mask = random_mask(2, 9, device=dev)
    outs = []
    for module in (layer, compiled):
        y = module(x, mask)
        grads = torch.autograd.grad(y.square().sum(), [x, layer.conv.weight, layer.conv.bias])
        outs.append((y, *grads))
    for name, eager, comp in zip(["y", "x", "weight", "bias"], *outs):
        assert_close(comp, eager, name=f"compiled {name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_step(backend):
    """The decode step (forward-only kernel under no_grad) under torch.compile(fullgraph=True)."""
    dev = device_of(backend)
    torch.manual_seed(0)
    layer = GLUConv1d(16, 3, causal=True, backend=backend).to(dev)
    step = torch.compile(layer.step, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 4, 16, device=dev)
    with torch.no_grad():
        state = layer.initial_state(2)
        for t in range(x.shape[1]):
            y_t, state = step(x[:, t], state)
        want = layer(x)[:, -1]
    assert_close(y_t, want, name="compiled step")


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_deterministic(backend):
    shape = (2, 9, 16, 3) if interpreted(backend) else (3, 40, 64, 3)
    x, w, b = make(*shape, device=device_of(backend))
    mask = random_mask(*shape[:2], device=x.device)
    leaves = [t.requires_grad_() for t in (x, w, b)]
    y = fastqa.glu_conv1d(x, w, b, causal=True, mask=mask, backend=backend)
    g = torch.randn_like(y)
    first = torch.autograd.grad(y, leaves, g, retain_graph=True)
    second = torch.autograd.grad(y, leaves, g)
    for a, c in zip(first, second):
        assert torch.equal(a, c)


@pytest.mark.parametrize("style", ["parametrizations", "legacy"])
def test_layer_weight_norm(style):
    torch.manual_seed(0)
    layer = GLUConv1d(12, 3, causal=True, backend="cpu")
    if style == "parametrizations":
        torch.nn.utils.parametrizations.weight_norm(layer.conv)
    else:
        with warnings.catch_warnings():  # deprecated in favour of parametrizations, still used by fairseq
            warnings.simplefilter("ignore")
            torch.nn.utils.weight_norm(layer.conv)
    params = [p for p in layer.parameters()]
    with torch.no_grad():  # change g and v after weight norm was applied: the layer must see the new weight
        for p in params:
            p.mul_(1.5).add_(0.1)
    x = torch.randn(2, 7, 12)
    y = layer(x)
    g, v = (layer.conv.parametrizations.weight.original0, layer.conv.parametrizations.weight.original1) \
        if style == "parametrizations" else (layer.conv.weight_g, layer.conv.weight_v)
    weight = torch._weight_norm(v, g, 0)
    y_ref = reference.glu_conv1d(x, weight, layer.conv.bias, causal=True)
    assert_close(y, y_ref, name="weight-normed output")
    got = torch.autograd.grad(y.sum(), [g, v])
    want = torch.autograd.grad(y_ref.sum(), [g, v])
    for name, a, c in zip(["g", "v"], got, want):
        assert_close(a, c, name=f"grad of weight_{name}")


# ----------------------------------------------------------------------------------------- step
@pytest.mark.parametrize("backend,k,bias", [(b, k, bias) for b in BACKENDS for k in (1, 2, 3, 5) for bias in (True, False)
                                            if not interpreted(b) or (k in (1, 3) and bias)])
@pytest.mark.parametrize("residual", [True, False])
def test_step_sequence_equals_causal(backend, k, residual, bias):
    dev = device_of(backend)
    torch.manual_seed(k)
    layer = GLUConv1d(20, k, causal=True, residual=residual, bias=bias, backend=backend).to(dev)
    x = torch.randn(3, 9, 20, device=dev)
    with torch.no_grad():
        full = layer(x)
        state = layer.initial_state(3)
        assert state.shape == (3, k - 1, 20)
        steps = []
        for t in range(x.shape[1]):
            y_t, state = layer.step(x[:, t], state)
            steps.append(y_t)
    assert_close(torch.stack(steps, 1), full, name="stepped vs causal")
    assert_close(state, x[:, x.shape[1] - (k - 1):], name="final state")


@pytest.mark.parametrize("backend, channels", [(b, 24) for b in BACKENDS]
                         + [(b, 300) for b in BACKENDS if not interpreted(b)])
def test_step_kernel_vs_reference(backend, channels):
    """The forward-only kernel on strided x_t / state, against the reference step. 300 channels: the CPU
    kernel's product in several chunks of channels, the last one partial."""
    dev = device_of(backend)
    x, w, b = make(4, 6, channels, 3, device=dev)
    state = x[:, 1:3].transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous [B, 2, H]
    x_t = x[:, 0]  # non-contiguous [B, H]
    for bias, residual, scale in [(b, True, 0.5 ** 0.5), (None, False, 1.0)]:
        got = fastqa.glu_conv1d_step(x_t, state, w, bias, residual=residual, scale=scale, backend=backend)
        want = reference.glu_conv1d_step(x_t, state, w, bias, residual=residual, scale=scale)
        assert_close(got[0], want[0], name="y_t")
        assert torch.equal(got[1], want[1])
        assert got[1].data_ptr() != state.data_ptr()


def test_step_with_grad_uses_autograd_path():
    x, w, b = make(2, 3, 8, 3)
    w.requires_grad_()
    y_t, _ = fastqa.glu_conv1d_step(x[:, 2], x[:, :2], w, b, backend="cpu")
    (gw,) = torch.autograd.grad(y_t.sum(), w)
    y_ref, _ = reference.glu_conv1d_step(x[:, 2], x[:, :2], w, b)
    (gw_ref,) = torch.autograd.grad(y_ref.sum(), w)
    assert_close(gw, gw_ref, name="grad of weight through step")


# ------------------------------------------------------------------------------------ bfloat16
needs_cpu = pytest.mark.skipif("cpu" not in BACKENDS, reason="fastqa._C is not built")


@needs_cpu
@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("shape", REAL + EDGE + [(2, 70, 200, 3), (1, 9, 260, 3)], ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_cpu_bfloat16_matches_float64_reference(shape, causal, masked, route, monkeypatch):
    """bf16 in and out (y and every gradient), float32 inside, each route forced (native: the products on the
    bf16 engine, through the micro-kernel where H is even -- (2, 70, 200, 3): a channel block and a row block
    cut short; (1, 9, 260, 3): the taps packed in two channel blocks --, else per-tap bf16 GEMMs; widen: the
    float32 kernel on widened inputs)."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    x, w, b = make(*shape)
    mask = random_mask(*shape[:2]) if masked else None
    kwargs = dict(causal=causal, mask=mask)
    check_bf16_against_float64(functools.partial(fastqa.glu_conv1d, backend="cpu"), reference.glu_conv1d, (x, w, b),
                               kwargs, names=["x", "weight", "bias"])


@needs_cpu
@pytest.mark.parametrize("residual,scale", [(False, 1.0), (True, 0.25)])
def test_cpu_bfloat16_no_bias_residual_scale(residual, scale):
    x, w, _ = make(3, 11, 24, 3, bias=False)
    kwargs = dict(causal=True, residual=residual, scale=scale, mask=random_mask(3, 11))
    check_bf16_against_float64(functools.partial(fastqa.glu_conv1d, backend="cpu"), reference.glu_conv1d, (x, w),
                               kwargs, names=["x", "weight"])


@needs_cpu
def test_cpu_bfloat16_takes_the_taps(monkeypatch):
    """Winograd's transforms of bf16 operands would lose far more than a rounding: the native bf16 route
    multiplies through the direct taps whatever FASTQA_CPU_GLU_CONV asks (forward and gradients the same either
    way). (The widen route runs the float32 kernel, Winograd included, on float32 operands.)"""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", "native")
    x, w, b = (t.to(torch.bfloat16) for t in make(2, 40, 64, 3))
    grad_y = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    runs = {}
    for algo in ("winograd", "taps"):
        monkeypatch.setenv("FASTQA_CPU_GLU_CONV", algo)
        runs[algo] = _glu_and_grads(x, w, b, grad_y, "cpu", causal=True)
    for name, a, c in zip(["y", "grad x", "grad weight", "grad bias"], runs["winograd"], runs["taps"]):
        assert a.dtype == torch.bfloat16 and torch.equal(a, c), name


@needs_cpu
def test_cpu_bfloat16_routes_measured_per_direction(monkeypatch):
    """Unforced, a bf16 call's forward and backward each pick a route for their shape class once (both timed) and
    keep it: the plan records both, and repeated calls are bit-identical."""
    from fastqa._backend import cpu_gemm_info

    monkeypatch.delenv("FASTQA_CPU_BF16_ROUTE", raising=False)
    x, w, b = (t.to(torch.bfloat16) for t in make(3, 23, 40, 3))  # a shape class no other test uses
    grad_y = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    first = _glu_and_grads(x, w, b, grad_y, "cpu", causal=True)
    routes = [r for r in cpu_gemm_info()["routes"] if r["shape"] == "B=4 T=32 H=64 K=4"]
    assert sorted(r["op"] for r in routes) == ["glu_conv1d_bwd", "glu_conv1d_fwd"], routes
    for r in routes:
        assert r["route"] in ("native", "widen") and r["ms"]["native"] > 0 and r["ms"]["widen"] > 0, r
    again = _glu_and_grads(x, w, b, grad_y, "cpu", causal=True)
    for name, a, c in zip(["y", "grad x", "grad weight", "grad bias"], first, again):
        assert a.dtype == torch.bfloat16 and torch.equal(a, c), name


@needs_cpu
@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("k, channels, bias", [(3, 24, True), (3, 300, False), (1, 24, True), (2, 512, True),
                                               (3, 13, True), (3, 256, True)], ids=str)
def test_cpu_bfloat16_step_matches_float64_reference(k, channels, bias, route, monkeypatch):
    """The decode step on strided bf16 x_t / state, each route forced (native: bf16 products on the packed
    weight, or the bf16 GEMM where H*K is odd; widen: the float32 step): y_t and the new state bf16 (the state
    is the model's rolling buffer, kept in its activations' dtype), y_t within bf16's tolerance, the state
    exact."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    x, w, b = make(4, k + 2, channels, k, bias=bias)
    state = x[:, 1:k].transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous [B, K-1, H]
    args, names = (x[:, 0], state, w, b), ["x_t", "state", "weight", "bias"]
    if not bias:
        args, names = args[:3], names[:3]
    step = functools.partial(fastqa.glu_conv1d_step, backend="cpu")
    check_bf16_against_float64(step, reference.glu_conv1d_step, args, names=names, grad_args=[False] * len(args),
                               outputs=2)
    low = [t.to(torch.bfloat16) for t in args]
    assert torch.equal(step(*low)[1], torch.cat([low[1], low[0][:, None]], 1)[:, 1:])  # the window's newest K-1


@needs_cpu
def test_cpu_bfloat16_step_sequence_equals_causal():
    """Stepping a bf16 sequence through the decode kernel gives the causal op's bf16 output position by position
    (both round the same float32 sums; products rounded per tap here, per GLU chunk there)."""
    torch.manual_seed(0)
    layer = GLUConv1d(64, 3, causal=True, backend="cpu").to(torch.bfloat16)
    x = torch.randn(5, 8, 64).to(torch.bfloat16)
    with torch.no_grad():
        full = layer(x)
        state = layer.initial_state(5)  # the weight's dtype: bf16
        steps = []
        for t in range(x.shape[1]):
            y_t, state = layer.step(x[:, t], state)
            assert y_t.dtype == state.dtype == torch.bfloat16
            steps.append(y_t)
    assert_close(torch.stack(steps, 1).float(), full.float(), name="stepped vs causal (bf16)", atol=2e-2, rtol=2e-2)
    assert torch.equal(state, x[:, -2:])


@needs_cpu
def test_cpu_bfloat16_opcheck_and_mixed_dtypes():
    """The schemas' fake tensors match the bf16 kernels (aux included, bf16 like x); a bf16 tensor mixed with a
    float32 one is refused, as float32 with float64 is."""
    x, w, b = (t.to(torch.bfloat16) for t in make(2, 6, 8, 3))
    mask = random_mask(2, 6)
    ops = torch.ops.fastqa
    torch.library.opcheck(ops.glu_conv1d_fwd, (x, w, b, mask, 1, True, 0.7))
    _, aux = ops.glu_conv1d_fwd(x, w, b, mask, 1, True, 0.7)
    assert aux.dtype == torch.bfloat16
    torch.library.opcheck(ops.glu_conv1d_bwd, (torch.randn_like(x), x, w, mask, aux, 1, True, 0.7, True))
    torch.library.opcheck(ops.glu_conv1d_step, (x[:, 0], x[:, 1:3], w, b, True, 0.7))
    with pytest.raises(RuntimeError, match="dtype"):
        ops.glu_conv1d_fwd(x, w.float(), b, mask, 1, True, 0.7)
    with pytest.raises(RuntimeError, match="dtype"):
        ops.glu_conv1d_fwd(x, w, b.float(), mask, 1, True, 0.7)
    with pytest.raises(RuntimeError, match="grad_y must match x"):
        ops.glu_conv1d_bwd(torch.randn_like(x).float(), x, w, mask, aux, 1, True, 0.7, True)
    with pytest.raises(RuntimeError, match="aux must be"):
        ops.glu_conv1d_bwd(torch.randn_like(x), x, w, mask, aux.float(), 1, True, 0.7, True)
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops.glu_conv1d_step(x[:, 0], x[:, 1:3].float(), w, b, True, 0.7)
    with pytest.raises(RuntimeError, match="dtype"):
        ops.glu_conv1d_step(x[:, 0], x[:, 1:3], w, b.float(), True, 0.7)


# --------------------------------------------------------------------------------- bad input
def _bad_calls():
    x, w, b = make(2, 5, 4, 3)
    mask = torch.ones(2, 5, dtype=torch.bool)
    op = functools.partial(fastqa.glu_conv1d, causal=True)
    return [
        ("x", ValueError, lambda: op(x[0], w, b)),
        ("x", TypeError, lambda: op(x.long(), w, b)),
        ("x", TypeError, lambda: op("x", w, b)),
        ("x", ValueError, lambda: op(x[:0], w, b)),  # empty batch
        ("x", ValueError, lambda: op(x[:, :0], w, b)),  # empty sequence
        ("x", ValueError, lambda: op(x.to("meta"), w.to("meta"), b.to("meta"))),
        ("weight", ValueError, lambda: op(x, w[:, :3], b)),  # channels mismatch
        ("weight", ValueError, lambda: op(x, w[..., 0], b)),  # rank
        ("weight", ValueError, lambda: op(x, w[..., :0], b)),  # K = 0
        ("weight", TypeError, lambda: op(x, w.double(), b)),
        ("weight", ValueError, lambda: op(x, w.to("meta"), b)),
        ("bias", ValueError, lambda: op(x, w, b[:4])),
        ("bias", TypeError, lambda: op(x, w, b.double())),
        ("mask", ValueError, lambda: op(x, w, b, mask=mask[:1])),  # batch mismatch
        ("mask", TypeError, lambda: op(x, w, b, mask=mask.float())),
        ("mask", ValueError, lambda: op(x, w, b, mask=mask.to("meta"))),
        ("kernel size", ValueError, lambda: fastqa.glu_conv1d(x, w[..., :2], b, causal=False)),
        ("causal", TypeError, lambda: fastqa.glu_conv1d(x, w, b, causal="yes")),
        ("residual", TypeError, lambda: op(x, w, b, residual=1)),
        ("scale", TypeError, lambda: op(x, w, b, scale="0.7")),
        ("backend", ValueError, lambda: op(x, w, b, backend="gpu")),
        ("x_t", ValueError, lambda: fastqa.glu_conv1d_step(x, x[:, :2], w, b)),
        ("x_t", ValueError, lambda: fastqa.glu_conv1d_step(x[:0, 0], x[:0, :2], w, b)),
        ("state", ValueError, lambda: fastqa.glu_conv1d_step(x[:, 0], x[:, :3], w, b)),
        ("state", ValueError, lambda: fastqa.glu_conv1d_step(x[:, 0], x[:1, :2], w, b)),  # batch mismatch
        ("state", TypeError, lambda: fastqa.glu_conv1d_step(x[:, 0], x[:, :2].double(), w, b)),
        ("weight", ValueError, lambda: fastqa.glu_conv1d_step(x[:, 0], x[:, :2], w[:6], b)),
        ("bias", ValueError, lambda: fastqa.glu_conv1d_step(x[:, 0], x[:, :2], w, b[:3])),
        ("scale", TypeError, lambda: fastqa.glu_conv1d_step(x[:, 0], x[:, :2], w, b, scale=None)),
        ("causal", ValueError, lambda: GLUConv1d(4, 3, causal=False).step(x[:, 0], x[:, :2])),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_input_raises_naming_argument(case):
    name, exc, call = _bad_calls()[case]
    with pytest.raises(exc, match=name):
        call()


# ----------------------------------------------------------------------------- backend choice
def test_backend_selection(monkeypatch):
    x, w, b = make(2, 5, 8, 3)
    w.requires_grad_()
    monkeypatch.delenv("FASTQA_BACKEND", raising=False)
    assert ran_kernels(lambda: fastqa.glu_conv1d(x, w, b, causal=True))  # auto on CPU float32 -> cpu
    assert not ran_kernels(lambda: fastqa.glu_conv1d(x, w, b, causal=True, backend="reference"))
    monkeypatch.setenv("FASTQA_BACKEND", "reference")
    y_ref = fastqa.glu_conv1d(x, w, b, causal=True)
    assert not ran_kernels(lambda: fastqa.glu_conv1d(x, w, b, causal=True))
    monkeypatch.setenv("FASTQA_BACKEND", "cpu")
    y_cpu = fastqa.glu_conv1d(x, w, b, causal=True)
    assert ran_kernels(lambda: fastqa.glu_conv1d(x, w, b, causal=True))
    assert_close(y_cpu, y_ref, name="forced cpu vs forced reference")
    assert ran_kernels(lambda: GLUConv1d(8, 3, causal=True)(x))  # the layer's "auto" follows the env too


def test_forcing_triton_on_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, b = make(2, 5, 8, 3)
    with pytest.raises(RuntimeError, match="triton"):
        fastqa.glu_conv1d(x, w, b, causal=True, backend="triton")
    with pytest.raises(RuntimeError, match="triton"):
        fastqa.glu_conv1d_step(x[:, 0], x[:, :2], w, b, backend="triton")
