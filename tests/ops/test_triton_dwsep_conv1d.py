"""Triton kernels of dwsep_conv1d (fastqa_triton::dwsep_conv1d_fwd / _bwd) against the reference.

Without CUDA the kernels run in the Triton interpreter on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET=1 before anything imports triton); there the kernels use 32-row x 16-channel blocks,
so the small shapes below cover partial L tiles, several C_in chunks / C_out blocks, and row splits
with several tiles or none. The reference runs in float64 on the same (rounded) inputs.
"""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from fastqa.reference.dwsep_conv1d import conv_padding, dwsep_conv1d as reference  # noqa: E402
from fastqa.triton_kernels import dwsep_conv1d as kernels  # noqa: E402,F401  (registers the ops)
from helpers import device_of, fp64_dot_skip_reason, TOLERANCES, assert_close  # noqa: E402

DEVICE = device_of("triton")
FWD = torch.ops.fastqa_triton.dwsep_conv1d_fwd
BWD = torch.ops.fastqa_triton.dwsep_conv1d_bwd
LN_FWD = torch.ops.fastqa_triton.ln_dwsep_conv1d_fwd
LN_BWD = torch.ops.fastqa_triton.ln_dwsep_conv1d_bwd
GRAD_NAMES = ("x", "dw_weight", "dw_bias", "pw_weight", "pw_bias", "ln_weight", "ln_bias")



def make_inputs(B, L, C_in, C_out, K, *, dtype=torch.float32, dw_bias=True, pw_bias=True, residual=True,
                strided=False, seed=0):
    """Kernel arguments (x, dw_weight, dw_bias, pw_weight, pw_bias, residual) on DEVICE.

    strided: x and residual are channels-first storage seen as [B, L, C] (non-contiguous).
    """
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)

    def activation(C):
        return rand(B, C, L).transpose(1, 2) if strided else rand(B, L, C)

    return (activation(C_in), rand(C_in, 1, K, scale=K ** -0.5), rand(C_in, scale=0.3) if dw_bias else None,
            rand(C_out, C_in, 1, scale=C_in ** -0.5), rand(C_out, scale=0.3) if pw_bias else None,
            activation(C_out) if residual else None)


def grad_output(B, L, C_out, dtype):
    """A non-contiguous upstream gradient (a transposed copy viewed back)."""
    return torch.randn(C_out, L, B).to(DEVICE, dtype).permute(2, 1, 0)


def relu_mask(aux, C_out):
    """Decode the forward's packed ReLU mask: bool [B, L, C_out]; bit o % 8 of byte o // 8."""
    bits = (aux.long().unsqueeze(-1) >> torch.arange(8, device=aux.device)) & 1
    return bits.flatten(-2)[..., :C_out].bool()


def pre_activation(x, dw_w, dw_b, pw_w, pw_b, padding, ln=None):
    """pw(dw(x)) + biases, with ln = (ln_weight, ln_bias, eps) the LayerNorm applied to x first."""
    if ln is not None:
        x = F.layer_norm(x, (x.shape[-1],), ln[0], ln[1], ln[2])
    return reference(x, dw_w, pw_w, pw_b, dw_bias=dw_b, padding=padding)


def reference_and_grads(args, padding, grad_y, mask=None, ln=None):
    """float64 reference output and the gradients of (x, dw_weight, dw_bias, pw_weight, pw_bias), then
    with ln = (ln_weight, ln_bias, eps) of (ln_weight, ln_bias).

    mask: None for no activation, else the ReLU mask to apply. A kernel's low-precision
    pre-activation can differ in sign from the exact one where it is ~0, which flips a gradient
    entry wholesale; so the gradients are checked under the kernel's own mask (whose agreement with
    the exact pre-activation away from 0 is checked separately by ``check_mask``).
    """
    x, dw_w, dw_b, pw_w, pw_b, res = [None if a is None else a.detach().double() for a in args]
    params = (x, dw_w, dw_b, pw_w, pw_b) + ((ln[0].double(), ln[1].double()) if ln is not None else ())
    leaves = [t.requires_grad_() if t is not None else None for t in params]
    y = pre_activation(*leaves[:5], padding, None if ln is None else (*leaves[5:], ln[2]))
    if mask is not None:
        y = y * mask
    if res is not None:
        y = y + res
    present = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(y, present, grad_y.double()))
    return y.detach(), [next(grads) if t is not None else None for t in leaves]


def check_mask(mask, args, padding, dtype, ln=None):
    """The saved mask equals [exact pre-activation > 0] wherever that is clear of rounding."""
    x, dw_w, dw_b, pw_w, pw_b, _ = [None if a is None else a.double() for a in args]
    pre = pre_activation(x, dw_w, dw_b, pw_w, pw_b, padding,
                         None if ln is None else (ln[0].double(), ln[1].double(), ln[2]))
    clear = pre.abs() > 4 * TOLERANCES["vs float64"][dtype][0] * max(1.0, pre.abs().max().item())
    assert torch.equal(mask[clear], (pre > 0)[clear]), "ReLU mask in aux disagrees with the pre-activation sign"


def close(got, want, name, dtype):
    atol, rtol = TOLERANCES["vs float64"][dtype]
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    assert got.dtype == dtype, f"{name}: dtype {got.dtype}, expected {dtype}"
    assert_close(got.double(), want, name=name, atol=atol * scale, rtol=rtol)


def check_case(B, L, C_in, C_out, K, padding, relu, *, dtype=torch.float32, layer_norm=False, **flags):
    """Forward, aux and every gradient of the kernels against the float64 reference.

    layer_norm: the fused pre-LayerNorm variant (ln_dwsep_conv1d_fwd / _bwd) instead.
    """
    if dtype == torch.float64 and fp64_dot_skip_reason():
        pytest.skip(fp64_dot_skip_reason())
    args = make_inputs(B, L, C_in, C_out, K, dtype=dtype, **flags)
    pad_left = conv_padding(K, padding)[0]
    grad_y = grad_output(B, L, C_out, dtype)
    x, dw_w, dw_b, pw_w, pw_b, res = args
    ln = None
    if layer_norm:
        g = torch.Generator().manual_seed(1)
        ln = ((1 + 0.3 * torch.randn(C_in, generator=g)).to(DEVICE, dtype),
              (0.3 * torch.randn(C_in, generator=g)).to(DEVICE, dtype), 1e-5)
        y, aux, stats = LN_FWD(x, ln[0], ln[1], ln[2], dw_w, dw_b, pw_w, pw_b, res, None, pad_left, relu)
        xd = x.double()
        close(stats[:, 0].to(dtype), xd.mean(-1), "LayerNorm mean", dtype)
        close(stats[:, 1].to(dtype), (xd.var(-1, unbiased=False) + ln[2]).rsqrt(), "LayerNorm rstd", dtype)
    else:
        y, aux = FWD(*args, pad_left, relu)
    mask = None
    if relu:
        assert aux.shape == (B, L, (C_out + 7) // 8) and aux.dtype == torch.uint8
        mask = relu_mask(aux, C_out)
        check_mask(mask, args, padding, dtype, ln)
    else:
        assert aux is None   # nothing allocated without ReLU
    want_y, want_grads = reference_and_grads(args, padding, grad_y, mask, ln)
    close(y, want_y, "y", dtype)
    if layer_norm:
        g = LN_BWD(grad_y, x, ln[0], ln[1], dw_w, dw_b, pw_w, pw_b, aux, stats, None, pad_left, relu)
        assert len(g) == 7
        grads = (g[0],) + tuple(g[3:]) + (g[1], g[2])  # to the reference's order
    else:
        grads = BWD(grad_y, x, dw_w, dw_b, pw_w, pw_b, aux, pad_left, relu)
        assert len(grads) == 5
    for name, got, want in zip(GRAD_NAMES, grads, want_grads):
        if want is None:
            assert got is None, f"grad of absent {name} must be None, got shape {tuple(got.shape)}"
        else:
            close(got, want, f"grad of {name}", dtype)


# B, L, C_in, C_out, K, padding, relu, flags -- every masking path: L < K, L = 1, partial L tiles,
# C_in / C_out not multiples of the block (and C_out of 8: packed ReLU mask), C_in != C_out, even K.
CASES = [
    (1, 1, 8, 8, 1, "same", False, dict(dw_bias=False, residual=False)),
    (2, 17, 16, 16, 3, "same", True, dict()),
    (1, 70, 32, 24, 7, "same", True, dict(dw_bias=False, strided=True)),
    (2, 33, 24, 32, 5, "causal", True, dict(pw_bias=False, residual=False)),
    (3, 5, 8, 20, 7, "causal", False, dict(dw_bias=False, pw_bias=False)),
    (1, 40, 20, 12, 4, "same", True, dict(residual=False, strided=True)),
    (2, 49, 32, 16, 5, "same", False, dict(dw_bias=False)),
    (1, 2, 12, 21, 3, "causal", True, dict()),
]


@pytest.mark.parametrize("B,L,C_in,C_out,K,padding,relu,flags", CASES)
def test_fwd_bwd_match_reference_fp32(B, L, C_in, C_out, K, padding, relu, flags):
    check_case(B, L, C_in, C_out, K, padding, relu, **flags)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B,L,C_in,C_out,K,padding,relu,flags", [CASES[5], CASES[7]])
def test_fwd_bwd_match_reference_half(B, L, C_in, C_out, K, padding, relu, flags, dtype):
    check_case(B, L, C_in, C_out, K, padding, relu, dtype=dtype, **flags)


def test_fwd_bwd_float64_tight():
    check_case(2, 19, 20, 18, 5, "same", True, dtype=torch.float64)


# The fused pre-LayerNorm variant (stretch): whole rows per tile in its grad_x kernel.
@pytest.mark.parametrize("dtype,B,L,C_in,C_out,K,padding,relu,flags", [
    (torch.float32, 2, 33, 24, 20, 5, "same", True, dict(strided=True)),
    (torch.float32, 1, 7, 32, 32, 7, "causal", False, dict(dw_bias=False, pw_bias=False, residual=False)),
    (torch.bfloat16, 1, 40, 20, 12, 3, "same", True, dict()),
    (torch.float64, 2, 19, 16, 18, 4, "same", True, dict(dw_bias=False)),
])
def test_layer_norm_variant(dtype, B, L, C_in, C_out, K, padding, relu, flags):
    check_case(B, L, C_in, C_out, K, padding, relu, dtype=dtype, layer_norm=True, **flags)


def test_relu_mask_padding_bits_are_zero():
    """C_out = 21: the last byte's bits for channels 21..23 stay zero."""
    x, dw_w, dw_b, pw_w, pw_b, _ = make_inputs(2, 9, 16, 21, 3, residual=False)
    _, aux = FWD(x, dw_w, dw_b, pw_w, pw_b - 5.0, None, 1, True)  # large negative bias: mostly off
    _, aux_on = FWD(x, dw_w, dw_b, pw_w, pw_b + 50.0, None, 1, True)  # all on
    assert torch.equal(aux_on[..., :2], torch.full_like(aux_on[..., :2], 255))
    assert torch.equal(aux_on[..., 2], torch.full_like(aux_on[..., 2], 31)), "bits past C_out must be zero"
    assert (aux[..., 2] < 32).all()


def test_inputs_untouched_and_backward_bitwise_reproducible():
    args = make_inputs(1, 45, 24, 20, 5, strided=True)
    x, dw_w, dw_b, pw_w, pw_b, res = args
    grad_y = grad_output(1, 45, 20, torch.float32)
    before = [t.clone() for t in (*args, grad_y)]
    y, aux = FWD(*args, 2, True)
    first = BWD(grad_y, x, dw_w, dw_b, pw_w, pw_b, aux, 2, True)
    second = BWD(grad_y, x, dw_w, dw_b, pw_w, pw_b, aux, 2, True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    for t, saved in zip((*args, grad_y), before):
        assert torch.equal(t, saved), "an input or the incoming gradient was modified"


def test_zero_length_gives_empty_output_and_zero_grads():
    x, dw_w, dw_b, pw_w, pw_b, res = make_inputs(2, 0, 8, 8, 3)
    y, aux = FWD(x, dw_w, dw_b, pw_w, pw_b, res, 1, True)
    assert y.shape == (2, 0, 8)
    grads = BWD(y, x, dw_w, dw_b, pw_w, pw_b, aux, 1, True)
    assert grads[0].shape == x.shape
    for g, p in zip(grads[1:], (dw_w, dw_b, pw_w, pw_b)):
        assert g.shape == p.shape and not g.any()


def test_bad_arguments_raise():
    x, dw_w, dw_b, pw_w, pw_b, res = make_inputs(1, 4, 8, 6, 3)
    for pad_left in (-1, 3):
        with pytest.raises(ValueError, match="pad_left"):
            FWD(x, dw_w, dw_b, pw_w, pw_b, res, pad_left, False)
    with pytest.raises(ValueError, match="residual"):
        FWD(x, dw_w, dw_b, pw_w, pw_b, res[:, :, :5], 1, False)
    with pytest.raises(ValueError, match="pw_weight"):
        FWD(x, dw_w, dw_b, pw_w[:, :7], pw_b, res, 1, False)
    with pytest.raises(TypeError, match="dw_weight"):
        FWD(x, dw_w.double(), dw_b, pw_w, pw_b, res, 1, False)
    y, aux = FWD(x, dw_w, dw_b, pw_w, pw_b, res, 1, True)
    with pytest.raises(ValueError, match="aux"):
        BWD(y, x, dw_w, dw_b, pw_w, pw_b, aux[:, :2], 1, True)
    with pytest.raises(ValueError, match="grad_y"):
        BWD(y[:, :3], x, dw_w, dw_b, pw_w, pw_b, aux, 1, True)


@pytest.mark.parametrize("relu", [False, True])
def test_opcheck(relu):
    args = make_inputs(1, 6, 8, 8, 3, dw_bias=relu, residual=not relu)
    torch.library.opcheck(FWD, (*args, 1, relu))
    y, aux = FWD(*args, 1, relu)
    x, dw_w, dw_b, pw_w, pw_b, _ = args
    torch.library.opcheck(BWD, (torch.randn_like(y), x, dw_w, dw_b, pw_w, pw_b, aux, 1, relu))


def test_opcheck_layer_norm_variant():
    x, dw_w, dw_b, pw_w, pw_b, res = make_inputs(1, 6, 8, 8, 3)
    ln_w, ln_b = torch.rand(8, device=DEVICE) + 0.5, torch.randn(8, device=DEVICE)
    mask = torch.arange(6, device=DEVICE).unsqueeze(0) < 4  # [1, 6]: two padded rows
    torch.library.opcheck(LN_FWD, (x, ln_w, ln_b, 1e-5, dw_w, dw_b, pw_w, pw_b, res, mask, 1, True))
    y, aux, stats = LN_FWD(x, ln_w, ln_b, 1e-5, dw_w, dw_b, pw_w, pw_b, res, mask, 1, True)
    torch.library.opcheck(LN_BWD, (torch.randn_like(y), x, ln_w, ln_b, dw_w, dw_b, pw_w, pw_b, aux, stats, mask, 1,
                                   True))


def test_compile_fullgraph_traces_through():
    """No graph break around the custom ops (aot_eager: tracing and fake tensors, no codegen)."""
    args = make_inputs(1, 10, 16, 16, 3)

    def fwd_bwd(x, dw_w, dw_b, pw_w, pw_b, res):
        y, aux = FWD(x, dw_w, dw_b, pw_w, pw_b, res, 1, True)
        return y, BWD(y * 2, x, dw_w, dw_b, pw_w, pw_b, aux, 1, True)

    torch._dynamo.reset()
    y, grads = torch.compile(fwd_bwd, fullgraph=True, backend="aot_eager")(*args)
    y_eager, grads_eager = fwd_bwd(*args)
    assert torch.equal(y, y_eager)
    for a, b in zip(grads, grads_eager):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestGPU:
    """The model shapes: QANet embedding encoder (k=7) and model encoder (k=5) at d=128, context 400
    and question 50, and the 500 -> 128 resizer (k=1)."""

    SHAPES = [(32, 400, 128, 128, 7), (32, 50, 128, 128, 7), (32, 400, 128, 128, 5), (32, 400, 500, 128, 1)]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("B,L,C_in,C_out,K", SHAPES)
    def test_model_shapes(self, B, L, C_in, C_out, K, dtype):
        check_case(B, L, C_in, C_out, K, "same", True, dtype=dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("L,K", [(400, 7), (50, 5)])
    def test_layer_norm_variant_model_shapes(self, L, K, dtype):
        check_case(32, L, 128, 128, K, "same", True, dtype=dtype, layer_norm=True)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_causal_no_bias_strided(self, dtype):
        check_case(16, 300, 128, 128, 5, "causal", False, dtype=dtype, dw_bias=False, residual=False,
                   strided=True)

    def test_backward_bitwise_reproducible(self):
        x, dw_w, dw_b, pw_w, pw_b, res = make_inputs(32, 400, 128, 128, 7, dtype=torch.bfloat16)
        y, aux = FWD(x, dw_w, dw_b, pw_w, pw_b, res, 3, True)
        grad_y = torch.randn_like(y)
        first = BWD(grad_y, x, dw_w, dw_b, pw_w, pw_b, aux, 3, True)
        for _ in range(5):
            for a, b in zip(first, BWD(grad_y, x, dw_w, dw_b, pw_w, pw_b, aux, 3, True)):
                assert torch.equal(a, b)

    def test_compile_fullgraph_inductor(self):
        args = make_inputs(8, 64, 128, 128, 5, dtype=torch.float16)

        def fwd_bwd(x, dw_w, dw_b, pw_w, pw_b, res):
            y, aux = FWD(x * 1.5, dw_w, dw_b, pw_w, pw_b, res, 2, True)
            return y, BWD(y.float().sin().to(y.dtype), x * 1.5, dw_w, dw_b, pw_w, pw_b, aux, 2, True)

        torch._dynamo.reset()
        y, grads = torch.compile(fwd_bwd, fullgraph=True)(*args)
        y_eager, grads_eager = fwd_bwd(*args)
        assert_close(y, y_eager, name="compiled y")
        for name, a, b in zip(GRAD_NAMES, grads, grads_eager):
            assert_close(a, b, name=f"compiled grad of {name}")
