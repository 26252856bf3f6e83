"""The Triton launchers' fp32-parameter contract (``triton_kernels._common``, ``ACCEPTS_FP32_WEIGHTS``):
dwsep_conv1d / ln_dwsep_conv1d, glu_conv1d (forward, backward, step), trilinear_similarity and
context_query_attention take their parameters in float32 with fp16 / bf16 activations.

What is checked, per op: every output and grad_x is bit for bit the one of the same call with the
parameters cast to the activations' dtype first (the kernels round them in registers as Tensor.to does);
each parameter gradient comes back in float32, and rounded to the activations' dtype it is exactly the
cast call's (the same fp32 partial sums, no round trip in between), while keeping bits the rounded one
lacks. Without a GPU this runs in the Triton interpreter (tests/conftest.py), on small shapes.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from helpers import device_of

pytest.importorskip("triton")
for _module in ("dwsep_conv1d", "glu_conv1d", "context_query_attention"):
    importlib.import_module(f"fastqa.triton_kernels.{_module}")  # registers fastqa_triton::*

OPS = torch.ops.fastqa_triton
DEVICE = device_of("triton")
LOW = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.fixture(autouse=True)
def default_configs(monkeypatch):
    """One configuration per kernel (the same for both calls compared; no autotuning on a GPU)."""
    monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "0")


def _rand(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)


def _cast(params: dict, dtype: torch.dtype) -> dict:
    return {k: None if v is None else v.to(dtype) for k, v in params.items()}


def _assert_same(got: tuple, want: tuple, names: tuple) -> None:
    for name, u, v in zip(names, got, want):
        assert u.dtype == v.dtype, f"{name}: {u.dtype} vs {v.dtype}"
        assert torch.equal(u, v), f"{name} differs from the call with the parameters cast first"


def _assert_param_grads(got: dict, want: dict, dtype: torch.dtype) -> None:
    """got: gradients of fp32 parameters; want: those of the same parameters cast to ``dtype``."""
    kept_bits = False
    for name, g in got.items():
        assert g.dtype == torch.float32, f"grad of {name}: {g.dtype}, expected the parameter's float32"
        assert want[name].dtype == dtype
        assert torch.equal(g.to(dtype), want[name]), f"grad of {name} rounded is not the cast call's"
        kept_bits |= bool((g.to(dtype).float() != g).any())
    assert kept_bits, "every fp32 gradient is exactly representable in the low dtype: was it rounded?"


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("ln", [False, True], ids=["dwsep", "ln_dwsep"])
def test_dwsep(dtype, ln):
    B, L, C_in, C_out, K, pad = 2, 37, 20, 24, 5, 2
    gen = torch.Generator().manual_seed(1)
    x = _rand(gen, B, L, C_in).to(dtype)
    res = _rand(gen, B, L, C_out).to(dtype)
    gy = _rand(gen, B, L, C_out).to(dtype)
    params = {"dw_weight": _rand(gen, C_in, 1, K, scale=K ** -0.5), "dw_bias": _rand(gen, C_in, scale=0.3),
              "pw_weight": _rand(gen, C_out, C_in, 1, scale=C_in ** -0.5), "pw_bias": _rand(gen, C_out, scale=0.3)}
    if ln:
        params.update(ln_weight=1 + _rand(gen, C_in, scale=0.2), ln_bias=_rand(gen, C_in, scale=0.2))
    mask = torch.rand(B, L, generator=gen).to(DEVICE) > 0.2

    def run(p: dict) -> tuple[tuple, dict]:
        if ln:
            y, aux, stats = OPS.ln_dwsep_conv1d_fwd(x, p["ln_weight"], p["ln_bias"], 1e-5, p["dw_weight"],
                                                   p["dw_bias"], p["pw_weight"], p["pw_bias"], res, mask, pad, True)
            grads = OPS.ln_dwsep_conv1d_bwd(gy, x, p["ln_weight"], p["ln_bias"], p["dw_weight"], p["dw_bias"],
                                            p["pw_weight"], p["pw_bias"], aux, stats, mask, pad, True)
            names = ("ln_weight", "ln_bias", "dw_weight", "dw_bias", "pw_weight", "pw_bias")
            return (y, aux, stats, grads[0]), dict(zip(names, grads[1:]))
        y, aux = OPS.dwsep_conv1d_fwd(x, p["dw_weight"], p["dw_bias"], p["pw_weight"], p["pw_bias"], res, pad, True)
        grads = OPS.dwsep_conv1d_bwd(gy, x, p["dw_weight"], p["dw_bias"], p["pw_weight"], p["pw_bias"], aux, pad,
                                     True)
        return (y, aux, grads[0]), dict(zip(("dw_weight", "dw_bias", "pw_weight", "pw_bias"), grads[1:]))

    got, got_grads = run(params)
    want, want_grads = run(_cast(params, dtype))
    _assert_same(got, want, ("y", "aux", "ln_stats", "grad_x") if ln else ("y", "aux", "grad_x"))
    _assert_param_grads(got_grads, want_grads, dtype)


def test_dwsep_parameters_each_in_their_own_dtype():
    """Only some parameters in fp32: each gradient in its own parameter's dtype, outputs unchanged."""
    gen = torch.Generator().manual_seed(2)
    x, gy = _rand(gen, 2, 19, 16).to(torch.bfloat16), _rand(gen, 2, 19, 16).to(torch.bfloat16)
    dww, pww = _rand(gen, 16, 1, 3, scale=0.5), _rand(gen, 16, 16, 1, scale=0.25).to(torch.bfloat16)
    pwb = _rand(gen, 16, scale=0.3)
    y, aux = OPS.dwsep_conv1d_fwd(x, dww, None, pww, pwb, None, 1, False)
    y_cast, _ = OPS.dwsep_conv1d_fwd(x, dww.bfloat16(), None, pww, pwb.bfloat16(), None, 1, False)
    assert torch.equal(y, y_cast)
    _, g_dww, g_dwb, g_pww, g_pwb = OPS.dwsep_conv1d_bwd(gy, x, dww, None, pww, pwb, aux, 1, False)
    assert (g_dww.dtype, g_pww.dtype, g_pwb.dtype) == (torch.float32, torch.bfloat16, torch.float32)
    assert g_dwb is None   # an absent bias has no gradient (no placeholder tensor)


@pytest.mark.parametrize("dtype", LOW)
def test_glu_conv1d(dtype):
    B, T, H, K, pad = 2, 21, 20, 3, 1
    gen = torch.Generator().manual_seed(3)
    x, gy = _rand(gen, B, T, H).to(dtype), _rand(gen, B, T, H).to(dtype)
    mask = torch.rand(B, T, generator=gen).to(DEVICE) > 0.3
    params = {"weight": _rand(gen, 2 * H, H, K, scale=(H * K) ** -0.5), "bias": _rand(gen, 2 * H, scale=0.5)}

    def run(p: dict) -> tuple[tuple, dict]:
        y, aux = OPS.glu_conv1d_fwd(x, p["weight"], p["bias"], mask, pad, True, 0.5 ** 0.5)
        gx, gw, gb = OPS.glu_conv1d_bwd(gy, x, p["weight"], mask, aux, pad, True, 0.5 ** 0.5, True)
        return (y, aux, gx), {"weight": gw, "bias": gb}

    got, got_grads = run(params)
    want, want_grads = run(_cast(params, dtype))
    _assert_same(got, want, ("y", "aux", "grad_x"))
    _assert_param_grads(got_grads, want_grads, dtype)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("K", [1, 3])
def test_glu_conv1d_step(dtype, K):
    B, H = 3, 20
    gen = torch.Generator().manual_seed(4)
    x_t, state = _rand(gen, B, H).to(dtype), _rand(gen, B, K - 1, H).to(dtype)
    w, b = _rand(gen, 2 * H, H, K, scale=(H * K) ** -0.5), _rand(gen, 2 * H, scale=0.5)
    got = OPS.glu_conv1d_step(x_t, state, w, b, True, 0.5 ** 0.5)
    want = OPS.glu_conv1d_step(x_t, state, w.to(dtype), b.to(dtype), True, 0.5 ** 0.5)
    _assert_same(got, want, ("y_t", "new_state"))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("op", ["trilinear", "attention"])
def test_context_query_attention(dtype, op):
    B, n, m, d = 2, 37, 19, 24
    gen = torch.Generator().manual_seed(5)
    c, q = _rand(gen, B, n, d).to(dtype), _rand(gen, B, m, d).to(dtype)
    c_mask = torch.rand(B, n, generator=gen).to(DEVICE) > 0.2
    q_mask = torch.rand(B, m, generator=gen).to(DEVICE) > 0.2
    params = {"weight": _rand(gen, 3 * d, scale=d ** -0.5), "bias": _rand(gen, 1)}

    def run(p: dict) -> tuple[tuple, dict]:
        if op == "trilinear":
            s = OPS.trilinear_similarity_fwd(c, q, p["weight"], p["bias"])
            gc, gq, gw, gb = OPS.trilinear_similarity_bwd(s, c, q, p["weight"], p["bias"])
            return (s, gc, gq), {"weight": gw, "bias": gb}
        out, lse_r, lse_c = OPS.context_query_attention_fwd(c, q, c_mask, q_mask, p["weight"], p["bias"])
        g = _rand(torch.Generator().manual_seed(6), B, n, 4 * d).to(dtype)
        gc, gq, gw, gb = OPS.context_query_attention_bwd(g, c, q, c_mask, q_mask, p["weight"], p["bias"], out,
                                                         lse_r, lse_c)
        return (out, lse_r, lse_c, gc, gq), {"weight": gw}  # grad_bias: rounding noise around 0, not compared

    got, got_grads = run(params)
    want, want_grads = run(_cast(params, dtype))
    names = ("s", "grad_c", "grad_q") if op == "trilinear" else ("out", "lse_row", "lse_col", "grad_c", "grad_q")
    _assert_same(got, want, names)
    _assert_param_grads(got_grads, want_grads, dtype)


def test_other_parameter_dtypes_are_refused():
    """float32 or the activations' dtype only: a bf16 weight with fp32 activations names the argument."""
    x = torch.randn(1, 4, 8, device=DEVICE)
    w16 = torch.randn(16, 8, 3, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="weight must have dtype torch.float32"):
        OPS.glu_conv1d_fwd(x, w16, None, None, 1, True, 1.0)
    with pytest.raises(TypeError, match="bias must have the weight's dtype"):
        OPS.glu_conv1d_step(x[:, 0].bfloat16(), torch.zeros(1, 2, 8, device=DEVICE, dtype=torch.bfloat16),
                            w16.float(), torch.zeros(16, device=DEVICE, dtype=torch.bfloat16), True, 1.0)
    with pytest.raises(TypeError, match="pw_weight must have dtype"):
        OPS.dwsep_conv1d_fwd(x, torch.randn(8, 1, 3, device=DEVICE), None, torch.randn(8, 8, 1, device=DEVICE,
                             dtype=torch.float16), None, None, 1, False)
    with pytest.raises(TypeError, match="weight must have dtype"):
        OPS.trilinear_similarity_fwd(x, x, torch.randn(24, device=DEVICE, dtype=torch.float64), None)


@pytest.mark.parametrize("module", ["dwsep_conv1d", "glu_conv1d", "context_query_attention"])
def test_the_contract_is_declared(module):
    assert importlib.import_module(f"fastqa.triton_kernels.{module}").ACCEPTS_FP32_WEIGHTS is True
