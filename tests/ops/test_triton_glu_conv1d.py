"""Triton GLU convolution kernels (fastqa_triton::glu_conv1d_fwd / _bwd / _step) against the reference.

Without a GPU the kernels run in the Triton interpreter on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET=1), so the shapes are small: 16-wide tiles, lengths and channel counts chosen to
hit every masking path (partial tiles, several tiles, T < K, K = 1, an all-padded sequence).
The GPU class at the bottom runs the model shapes on CUDA.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import fastqa  # noqa: E402
from fastqa.reference.glu_conv1d import glu_conv1d, glu_conv1d_step  # noqa: E402
from fastqa.triton_kernels import glu_conv1d as kernels  # noqa: E402
from helpers import (device_of, fp64_dot_skip_reason, TOLERANCES,  # noqa: E402
                     assert_close, ran_ops)

OPS = torch.ops.fastqa_triton
DEVICE = device_of("triton")
SCALE = 0.5 ** 0.5


@pytest.fixture(autouse=True)
def _ieee_fp32(request):
    """The kernels use plain TF32 for fp32 dots exactly when torch's float32 matmul precision allows it
    (``triton_kernels._common.dot_precision``); keep it at "highest" so the small-shape comparisons hold
    at fp32 tolerances on a GPU (the conftest's ``ieee_fp32`` keeps the fp32 references IEEE). TestGPU keeps
    the setting it is given."""
    if request.cls is TestGPU:
        yield
        return
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def skip_without_fp64_dot() -> None:
    reason = fp64_dot_skip_reason()
    if reason:
        pytest.skip(reason)


def _pad_left(k: int, causal: bool) -> int:
    return k - 1 if causal else (k - 1) // 2


def _make_inputs(B: int, T: int, H: int, K: int, *, mask: str | None, bias: bool, dtype=torch.float32,
                 strided: bool = False, seed: int = 0):
    """x [B, T, H], weight [2H, H, K] (conv-like scale), bias [2H] or None, mask [B, T] or None.

    mask: None, "random", or "padded_row" (random, with sequence 0 entirely padding). strided: x and
    mask are transposed views of channels-first / time-major storage (non-contiguous).
    """
    g = torch.Generator().manual_seed(seed)
    if strided:
        x = torch.randn(B, H, T, generator=g).transpose(1, 2)
    else:
        x = torch.randn(B, T, H, generator=g)
    w = torch.randn(2 * H, H, K, generator=g) / (H * K) ** 0.5
    b = torch.randn(2 * H, generator=g) * 0.5 if bias else None
    m = None
    if mask is not None:
        m = torch.rand(T, B, generator=g).T > 0.3
        m[:, 0] = True
        if mask == "padded_row":
            m[0] = False
        if not strided:
            m = m.contiguous()
    cast = lambda t: None if t is None else t.to(device=DEVICE, dtype=dtype)  # noqa: E731
    return cast(x), cast(w), cast(b), None if m is None else m.to(DEVICE)


def _reference_grads(x, w, b, m, gy, *, causal, residual, dtype=None):
    """Reference output and (grad_x, grad_weight, grad_bias) through autograd, computed in ``dtype``."""
    dtype = dtype or x.dtype
    leaves = [t.detach().to(dtype).requires_grad_() if t is not None else None for t in (x, w, b)]
    y = glu_conv1d(leaves[0], leaves[1], leaves[2], causal=causal, residual=residual, scale=SCALE, mask=m)
    grads = torch.autograd.grad(y, [t for t in leaves if t is not None], gy.to(dtype))
    return y.detach(), grads


def _run_fwd_bwd(x, w, b, m, gy, *, causal, residual):
    pad_left = _pad_left(w.shape[-1], causal)
    y, aux = OPS.glu_conv1d_fwd(x, w, b, m, pad_left, residual, SCALE)
    gx, gw, gb = OPS.glu_conv1d_bwd(gy, x, w, m, aux, pad_left, residual, SCALE, b is not None)
    return y, aux, gx, gw, gb


def _upstream_grad(B, T, H, dtype):
    """A non-contiguous upstream gradient (a permuted view), to catch stride bugs."""
    return torch.randn(H, T, B, device=DEVICE, dtype=dtype).permute(2, 1, 0)


def _check_case(B, T, H, K, causal, mask, residual, bias, *, dtype=torch.float32, strided=False):
    x, w, b, m = _make_inputs(B, T, H, K, mask=mask, bias=bias, dtype=dtype, strided=strided)
    gy = _upstream_grad(B, T, H, dtype)
    before = [t.clone() for t in (x, w, b, m, gy) if t is not None]
    y, aux, gx, gw, gb = _run_fwd_bwd(x, w, b, m, gy, causal=causal, residual=residual)
    after = [t for t in (x, w, b, m, gy) if t is not None]
    assert all(torch.equal(u, v) for u, v in zip(before, after)), "an input or grad_y was modified"

    low = dtype in TOLERANCES["vs fp32"]
    atol, rtol = TOLERANCES["vs fp32"][dtype] if low else (None, None)
    ref_dtype = torch.float32 if low else dtype
    y_ref, grads_ref = _reference_grads(x, w, b, m, gy, causal=causal, residual=residual, dtype=ref_dtype)
    assert y.dtype == dtype and gx.dtype == dtype and gw.dtype == dtype
    assert aux.shape == (B, T, 2 * H)
    assert_close(y.to(ref_dtype), y_ref, name="y", atol=atol, rtol=rtol)
    assert_close(gx.to(ref_dtype), grads_ref[0], name="grad_x", atol=atol, rtol=rtol)
    assert_close(gw.to(ref_dtype), grads_ref[1], name="grad_weight", atol=atol, rtol=rtol)
    if bias:
        assert gb.dtype == dtype
        assert_close(gb.to(ref_dtype), grads_ref[2], name="grad_bias", atol=atol, rtol=rtol)
    else:
        assert gb is None, "an absent bias has no gradient (None, nothing allocated)"


# B, T, H, K, causal, mask, residual, bias
CASES = [
    pytest.param(2, 21, 20, 3, True, "random", True, True, id="causal-k3-two_tiles_partial"),
    pytest.param(1, 5, 12, 7, True, None, True, True, id="causal-k7-T_lt_K-batch1"),
    pytest.param(2, 17, 12, 5, False, "random", False, False, id="centred-k5-no_residual-no_bias"),
    pytest.param(3, 16, 16, 1, False, None, True, True, id="centred-k1-exact_tiles"),
    pytest.param(2, 9, 8, 1, True, "padded_row", False, True, id="causal-k1-all_padded_sequence"),
    pytest.param(2, 3, 7, 5, False, "padded_row", True, True, id="centred-k5-T_lt_K-all_padded"),
    pytest.param(2, 19, 12, 2, True, "random", True, False, id="causal-k2-even"),
    pytest.param(1, 12, 12, 7, False, "random", True, True, id="centred-k7"),
    pytest.param(2, 1, 12, 3, True, "random", False, True, id="causal-T1"),
]


@pytest.mark.parametrize("B, T, H, K, causal, mask, residual, bias", CASES)
def test_fwd_bwd_fp32(B, T, H, K, causal, mask, residual, bias):
    _check_case(B, T, H, K, causal, mask, residual, bias)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "centred"])
def test_fwd_bwd_strided_inputs(causal):
    """x as a channels-first view, a transposed mask and a permuted grad_y: read through strides."""
    _check_case(2, 18, 12, 3, causal, "random", True, True, strided=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal, mask", [(True, None), (False, "padded_row")], ids=["causal", "centred-mask"])
def test_fwd_bwd_low_precision(dtype, causal, mask):
    _check_case(2, 19, 12, 3, causal, mask, True, True, dtype=dtype)


def test_fwd_bwd_fp64():
    """fp64 in, fp64 accumulation (gradcheck-grade agreement in the interpreter)."""
    skip_without_fp64_dot()
    _check_case(2, 11, 12, 3, True, "random", True, True, dtype=torch.float64)


@pytest.mark.parametrize("splits", [3, 7])
def test_weight_grad_splits(monkeypatch, splits):
    """grad_weight reduced over several row splits, including more splits than row tiles (zero partials)."""
    monkeypatch.setattr(kernels, "_weight_grad_splits", lambda *args: splits)
    _check_case(2, 20, 12, 3, True, "random", True, True)


def test_backward_is_repeatable():
    x, w, b, m = _make_inputs(2, 21, 12, 3, mask="random", bias=True)
    gy = _upstream_grad(2, 21, 12, torch.float32)
    first = _run_fwd_bwd(x, w, b, m, gy, causal=True, residual=True)
    second = _run_fwd_bwd(x, w, b, m, gy, causal=True, residual=True)
    for name, u, v in zip(("y", "aux", "grad_x", "grad_weight", "grad_bias"), first, second):
        assert torch.equal(u, v), f"{name} differs between two identical calls"


def _step_through(x, w, b, *, residual):
    """Run the step op over the whole sequence x [B, T, H] from a zero state."""
    B, T, H = x.shape
    state = torch.zeros(B, w.shape[-1] - 1, H, device=x.device, dtype=x.dtype)
    ys = []
    for t in range(T):
        x_t = x[:, t]
        before = state.clone()
        y_t, new_state = OPS.glu_conv1d_step(x_t, state, w, b, residual, SCALE)
        assert torch.equal(state, before), "step modified its state input"
        assert new_state.shape == state.shape
        assert new_state.numel() == 0 or new_state.data_ptr() != state.data_ptr(), "new_state aliases state"
        ys.append(y_t)
        state = new_state
    return torch.stack(ys, dim=1), state


@pytest.mark.parametrize("B, T, H, K, residual, bias", [
    pytest.param(2, 9, 12, 3, True, True, id="k3"),
    pytest.param(1, 6, 20, 1, True, True, id="k1-empty_state"),
    pytest.param(3, 7, 12, 2, False, False, id="k2-no_residual-no_bias"),
    pytest.param(2, 3, 7, 5, True, True, id="k5-T_lt_K"),
    pytest.param(17, 4, 12, 3, False, True, id="batch17-two_batch_tiles"),
    # Edge shapes of the step kernel's tiles (16 rows x 8 channels x 16 input channels here): one row, channel
    # counts that are no multiple of either tile, every K from 1 to 5.
    pytest.param(1, 4, 20, 1, True, True, id="batch1-H20-k1"),
    pytest.param(1, 5, 20, 2, False, True, id="batch1-H20-k2"),
    pytest.param(1, 4, 37, 3, True, False, id="batch1-H37-k3"),
    pytest.param(5, 6, 13, 4, True, True, id="batch5-H13-k4"),
    pytest.param(1, 7, 9, 5, False, True, id="batch1-H9-k5"),
    pytest.param(33, 3, 25, 5, True, True, id="batch33-H25-k5-three_batch_tiles"),
])
def test_step_matches_causal_sequence(B, T, H, K, residual, bias):
    x, w, b, _ = _make_inputs(B, T, H, K, mask=None, bias=bias)
    ys, state = _step_through(x, w, b, residual=residual)
    y_ref = glu_conv1d(x, w, b, causal=True, residual=residual, scale=SCALE)
    assert_close(ys, y_ref, name="stepped y")
    # The final state holds the last K-1 inputs, zeros where the sequence is shorter.
    padded = torch.cat([torch.zeros(B, K - 1, H, device=x.device), x], dim=1)
    assert torch.equal(state, padded[:, padded.shape[1] - (K - 1):])


def test_step_weight_is_packed_once_and_again_when_it_changes():
    """The packed weight is laid out once per weight tensor and dtype (not per step), and again after an
    in-place change of the weight, which the next step then uses."""
    B, T, H, K = 2, 3, 12, 3
    x, w, b, _ = _make_inputs(B, T, H, K, mask=None, bias=True)
    first = kernels.packed_weight(w, x.dtype)
    assert kernels.packed_weight(w, x.dtype) is first
    assert first.shape == (K, H, H, 2)
    assert torch.equal(first, w.view(2, H, H, K).permute(3, 2, 1, 0))
    assert kernels.packed_weight(w, torch.float64) is not first   # one copy per activation dtype
    ys, _ = _step_through(x, w, b, residual=True)
    assert kernels.packed_weight(w, x.dtype) is first, "stepping re-laid an unchanged weight"
    with torch.no_grad():
        w.mul_(-2.0)
    assert kernels.packed_weight(w, x.dtype) is not first
    ys_changed, _ = _step_through(x, w, b, residual=True)
    assert_close(ys_changed, glu_conv1d(x, w, b, causal=True, residual=True, scale=SCALE), name="after the change")
    assert not torch.allclose(ys, ys_changed)


def test_step_packed_weights_go_with_their_weight():
    import gc

    before = len(kernels._PACKED)
    w = torch.randn(16, 8, 3, device=DEVICE)
    kernels.packed_weight(w, w.dtype)
    assert len(kernels._PACKED) == before + 1
    del w
    gc.collect()
    assert len(kernels._PACKED) == before


def test_step_inference_tensor_weight():
    """Inference tensors have no version counter: packed on every call, and right."""
    with torch.inference_mode():
        x, w, b, _ = _make_inputs(2, 4, 12, 3, mask=None, bias=True)
        ys, _ = _step_through(x, w, b, residual=True)
        assert kernels.packed_weight(w, w.dtype) is not kernels.packed_weight(w, w.dtype)
    assert_close(ys, glu_conv1d(x, w, b, causal=True, residual=True, scale=SCALE), name="stepped y")


def test_step_strided_state_and_low_precision():
    """A non-contiguous state and x_t in bf16 against the reference step in fp32."""
    B, H, K = 3, 12, 4
    x, w, b, _ = _make_inputs(B, 1, H, K, mask=None, bias=True, dtype=torch.bfloat16)
    state = torch.randn(B, H, K - 1, device=DEVICE).to(torch.bfloat16).transpose(1, 2)
    x_t = torch.randn(H, B, device=DEVICE).to(torch.bfloat16).T
    y_t, new_state = OPS.glu_conv1d_step(x_t, state, w, b, True, SCALE)
    y_ref, state_ref = glu_conv1d_step(x_t.float(), state.float(), w.float(), b.float(), residual=True, scale=SCALE)
    assert y_t.dtype == torch.bfloat16
    assert_close(y_t.float(), y_ref, name="y_t", atol=TOLERANCES["vs fp32"][torch.bfloat16][0],
                 rtol=TOLERANCES["vs fp32"][torch.bfloat16][1])
    assert torch.equal(new_state.float(), state_ref)


def test_direct_call_rejects_bad_shapes():
    x, w, b, m = _make_inputs(1, 4, 8, 3, mask="random", bias=True)
    with pytest.raises(ValueError, match="pad_left"):
        OPS.glu_conv1d_fwd(x, w, b, m, 3, True, SCALE)
    with pytest.raises(ValueError, match="weight"):
        OPS.glu_conv1d_fwd(x, w[:, :4], b, m, 2, True, SCALE)
    with pytest.raises(ValueError, match="state"):
        OPS.glu_conv1d_step(x[:, 0], torch.zeros(1, 3, 8, device=DEVICE), w, b, True, SCALE)


def test_registry_resolves_the_triton_ops():
    """The public entry points with backend="triton" run exactly these custom ops (forward, backward, step)."""
    x, w, b, m = _make_inputs(1, 5, 8, 3, mask="random", bias=True)
    x.requires_grad_(True)
    ran = ran_ops(lambda: fastqa.glu_conv1d(x, w, b, causal=False, mask=m, backend="triton").sum().backward())
    assert ran == {"fastqa_triton::glu_conv1d_fwd", "fastqa_triton::glu_conv1d_bwd"}
    state = torch.zeros(1, 2, 8, device=DEVICE)
    with torch.no_grad():
        ran = ran_ops(lambda: fastqa.glu_conv1d_step(x[:, 0], state, w, b, backend="triton"))
    assert ran == {"fastqa_triton::glu_conv1d_step"}


def test_zero_length_sequence_gives_initialised_outputs():
    """T = 0 launches nothing: empty outputs, and zero (not uninitialised) weight and bias gradients."""
    x, w, b, _ = _make_inputs(2, 0, 8, 3, mask=None, bias=True)
    y, aux = OPS.glu_conv1d_fwd(x, w, b, None, 2, True, SCALE)
    assert y.shape == (2, 0, 8) and aux.shape == (2, 0, 16)
    gx, gw, gb = OPS.glu_conv1d_bwd(y, x, w, None, aux, 2, True, SCALE, True)
    assert gx.shape == x.shape and torch.equal(gw, torch.zeros_like(w)) and torch.equal(gb, torch.zeros_like(b))


def test_opcheck():
    x, w, b, m = _make_inputs(1, 5, 4, 3, mask="random", bias=True)
    y, aux = OPS.glu_conv1d_fwd(x, w, b, m, 1, True, SCALE)
    torch.library.opcheck(OPS.glu_conv1d_fwd.default, (x, w, b, m, 1, True, SCALE))
    torch.library.opcheck(OPS.glu_conv1d_fwd.default, (x, w, None, None, 2, False, 1.0))
    torch.library.opcheck(OPS.glu_conv1d_bwd.default, (torch.randn_like(y), x, w, m, aux, 1, True, SCALE, True))
    torch.library.opcheck(OPS.glu_conv1d_step.default, (x[:, 0], torch.randn(1, 2, 4, device=DEVICE), w, b,
                                                        True, SCALE))


def test_torch_compile_fullgraph():
    """The three ops stay in one graph (fake implementations); aot_eager keeps it cheap on CPU."""
    x, w, b, m = _make_inputs(2, 6, 12, 3, mask="random", bias=True)
    gy = _upstream_grad(2, 6, 12, torch.float32)
    state = torch.randn(2, 2, 12, device=DEVICE)

    def f(x, w, b, m, gy, state):
        y, aux = OPS.glu_conv1d_fwd(x, w, b, m, 2, True, SCALE)
        grads = OPS.glu_conv1d_bwd(gy, x, w, m, aux, 2, True, SCALE, True)
        return (y, *grads, *OPS.glu_conv1d_step(x[:, 0], state, w, b, True, SCALE))

    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    got = torch.compile(f, fullgraph=True, backend=backend)(x, w, b, m, gy, state)
    for i, (u, v) in enumerate(zip(got, f(x, w, b, m, gy, state))):
        assert_close(u, v, name=f"compiled output {i}")


# ---------------------------------------------------------------------------------------------
# GPU: the ConvS2S shapes
# ---------------------------------------------------------------------------------------------



def _assert_rel(actual: torch.Tensor, expected: torch.Tensor, tol: float, name: str) -> None:
    err = (actual.double() - expected.double()).abs().max().item()
    ref = expected.double().abs().max().item()
    assert err <= tol * max(ref, 1.0), f"{name}: max |diff| {err:.3e} vs max |ref| {ref:.3e} (tol {tol})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestGPU:
    B, T, H = 16, 100, 512

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
    @pytest.mark.parametrize("causal, K, mask", [(True, 3, None), (False, 3, "padded_row"), (True, 5, None)],
                             ids=["decoder-k3", "encoder-k3-mask", "causal-k5"])
    def test_model_shapes(self, dtype, causal, K, mask):
        x, w, b, m = _make_inputs(self.B, self.T, self.H, K, mask=mask, bias=True, dtype=dtype)
        gy = _upstream_grad(self.B, self.T, self.H, dtype)
        y, _, gx, gw, gb = _run_fwd_bwd(x, w, b, m, gy, causal=causal, residual=True)
        y_ref, (gx_ref, gw_ref, gb_ref) = _reference_grads(x, w, b, m, gy, causal=causal, residual=True,
                                                           dtype=torch.float64)
        tol = TOLERANCES["gpu model shapes"][dtype][0]
        for name, u, v in (("y", y, y_ref), ("grad_x", gx, gx_ref), ("grad_weight", gw, gw_ref),
                           ("grad_bias", gb, gb_ref)):
            assert u.dtype == dtype
            _assert_rel(u, v, tol, name)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_backward_bitwise_repeatable(self, dtype):
        x, w, b, m = _make_inputs(self.B, self.T, self.H, 3, mask="random", bias=True, dtype=dtype)
        gy = _upstream_grad(self.B, self.T, self.H, dtype)
        y, aux = OPS.glu_conv1d_fwd(x, w, b, m, 2, True, SCALE)
        first = OPS.glu_conv1d_bwd(gy, x, w, m, aux, 2, True, SCALE, True)
        for _ in range(5):
            again = OPS.glu_conv1d_bwd(gy, x, w, m, aux, 2, True, SCALE, True)
            assert all(torch.equal(u, v) for u, v in zip(first, again))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
    def test_step_decodes_sequence(self, dtype):
        B, T, H, K = 40, 12, self.H, 3
        x, w, b, _ = _make_inputs(B, T, H, K, mask=None, bias=True, dtype=dtype)
        ys, _ = _step_through(x, w, b, residual=False)
        y_ref = glu_conv1d(x.double(), w.double(), b.double(), causal=True, residual=False, scale=SCALE)
        _assert_rel(ys, y_ref, TOLERANCES["gpu model shapes"][dtype][0], "stepped y")

    def test_torch_compile_fullgraph_model_shapes(self):
        x, w, b, m = _make_inputs(self.B, self.T, self.H, 3, mask="random", bias=True, dtype=torch.float16)

        def f(x, w, b, m):
            y, aux = OPS.glu_conv1d_fwd(x, w, b, m, 1, True, SCALE)
            return y * 2.0, aux

        got = torch.compile(f, fullgraph=True)(x, w, b, m)
        want = f(x, w, b, m)
        assert torch.equal(got[1], want[1])
        _assert_rel(got[0], want[0], 1e-3, "compiled y")
