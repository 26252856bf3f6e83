"""GLU convolution (ConvS2S), causal and centred, and its one-step decode: autograd Function + dispatch.

Kernels (per compiled backend, identical schemas; ``ns`` = ``fastqa`` or ``fastqa_triton``)::

    ns::glu_conv1d_fwd(x, weight, bias?, mask?, pad_left, residual, scale) -> (y, aux)
    ns::glu_conv1d_bwd(grad_y, x, weight, mask?, aux, pad_left, residual, scale, has_bias)
        -> (grad_x, grad_weight, grad_bias?)         # grad_bias is None when has_bias is False
    ns::glu_conv1d_step(x_t, state, weight, bias?, residual, scale) -> (y_t, new_state)   # forward only

``aux`` is whatever the backend's backward wants (the CPU kernel: the pre-activation in its padded
row space, [B*(T+K-1) - (K-1), 2H]); the Function saves it and hands it back unread.
"""
from __future__ import annotations

import torch

from .. import reference
from .._backend import resolve_backend, warn_cuda_reference
from .._checks import cast_floating, check_bool, check_number, check_optional, check_tensor, entry_prologue
from ..reference.glu_conv1d import SQRT_HALF
from ._declare import OpDecl, declare, example
from ._function import has_tangent, records_grad
from ._registry import kernel, takes_fp32_params

_MODULE = "glu_conv1d"

__all__ = ["glu_conv1d", "glu_conv1d_step"]


def _save(ctx, inputs: tuple, outputs: tuple) -> None:
    x, weight, bias, mask, pad_left, residual, scale = inputs
    ctx.save_for_backward(x, weight, mask, outputs[1])   # aux
    ctx.pad_left, ctx.residual, ctx.scale, ctx.has_bias = pad_left, residual, scale, bias is not None


def _grads(ctx, grad_y: torch.Tensor) -> dict:
    x, weight, mask, aux = ctx.saved_tensors
    grads = kernel(ctx.backend, _MODULE, "glu_conv1d_bwd")(
        grad_y, x, weight, mask, aux, ctx.pad_left, ctx.residual, ctx.scale, ctx.has_bias)
    return dict(zip(("x", "weight", "bias"), grads))


def _fwd_fake(x, weight, bias, mask, pad_left, residual, scale):
    b, t, h = x.shape
    k = weight.shape[2]
    return x.new_empty((b, t, h)), x.new_empty((b * (t + k - 1) - (k - 1), 2 * h))


def _bwd_fake(grad_y, x, weight, mask, aux, pad_left, residual, scale, has_bias):
    return (x.new_empty(x.shape), weight.new_empty(weight.shape),
            weight.new_empty((weight.shape[0],)) if has_bias else None)


def _step_fake(x_t, state, weight, bias, residual, scale):
    return x_t.new_empty(x_t.shape), state.new_empty(state.shape)


# y = GLU(conv(pad(x·mask)) + bias) (+ x) · scale through a backend's fused kernels.
_GLU = declare(OpDecl(
    "glu_conv1d", _MODULE, ("x", "weight", "bias", "mask", "pad_left", "residual", "scale"), _grads, _save,
    fakes={"glu_conv1d_fwd": _fwd_fake, "glu_conv1d_bwd": _bwd_fake, "glu_conv1d_step": _step_fake}))


def _check_weight(weight: object, like: torch.Tensor, channels: int, fp32: bool) -> int:
    """weight [2H, H, K] on like's device, in like's dtype (or float32 with ``fp32``); returns K."""
    check_tensor("weight", weight, shape=(2 * channels, channels, None), like=like, or_float32=fp32)
    if weight.shape[2] == 0:
        raise ValueError(f"weight must have a kernel size K >= 1, got shape {tuple(weight.shape)}")
    return weight.shape[2]


def glu_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, causal: bool,
               residual: bool = True, scale: float = SQRT_HALF, mask: torch.Tensor | None = None,
               backend: str = "auto") -> torch.Tensor:
    """Fused padding + conv1d H -> 2H + GLU + residual + scale (ConvS2S block).

    x: [B, T, H] (any strides, e.g. a channels-first [B, H, T] tensor's transpose); weight: [2H, H, K]
    (nn.Conv1d layout); bias: [2H] or None; mask: [B, T] bool, True = real token, or None (padded
    positions are zeroed before the conv; the residual uses the unmasked x).
    causal: K-1 zeros on the left; otherwise centred, which needs K odd ((K-1)/2 zeros each side).
    Returns y: [B, T, H] = (a·sigmoid(b) + x)·scale, or a·sigmoid(b)·scale without the residual,
    where [a; b] = conv(...) split along channels (F.glu order).
    backend: "auto", "reference", "cpu" or "triton" (see ``fastqa.info()``).
    """
    fp32 = takes_fp32_params(backend, "glu_conv1d", _MODULE, x)
    x, weight, bias = entry_prologue("x", x, 3, weight, bias, params=2, fp32_params=fp32)
    channels = x.shape[2]
    k = _check_weight(weight, x, channels, fp32)
    check_optional("bias", bias, shape=(2 * channels,), like=x, or_float32=fp32)
    if mask is not None:
        check_tensor("mask", mask, shape=(x.shape[0], x.shape[1]), dtype=torch.bool, floating=False, like=x)
    causal = check_bool("causal", causal)
    residual = check_bool("residual", residual)
    scale = check_number("scale", scale)
    if not causal and k % 2 == 0:
        raise ValueError(f"kernel size (weight.shape[2]) must be odd for centred (causal=False) padding, got {k}")

    backend = resolve_backend(backend, "glu_conv1d", x.device, x.dtype)
    if backend == "reference" or has_tangent(x, weight, bias):
        if backend != "reference":
            warn_cuda_reference("glu_conv1d", x.device, "an input carries a forward-mode tangent")
        weight, bias = cast_floating(x.dtype, weight, bias)
        return reference.glu_conv1d(x, weight, bias, causal=causal, residual=residual, scale=scale, mask=mask)
    pad_left = k - 1 if causal else (k - 1) // 2
    return _GLU.call(backend, x, weight, bias, mask, pad_left, residual, scale)


def glu_conv1d_step(x_t: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    *, residual: bool = True, scale: float = SQRT_HALF,
                    backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """One position of the causal op, for incremental decoding.

    x_t: [B, H]; state: [B, K-1, H], the K-1 previous inputs oldest first (zeros before the sequence
    starts; [B, 0, H] for K = 1); weight: [2H, H, K]; bias: [2H] or None.
    Returns (y_t [B, H], new_state [B, K-1, H]); stepping through a sequence reproduces
    ``glu_conv1d(..., causal=True)`` position by position.

    The fused step kernel is forward-only: it runs when no input needs a gradient (decoding under
    ``torch.no_grad()`` or with frozen tensors); when autograd is recording for any input, or an input
    carries a forward-mode tangent (torch.func.jvp, forward_ad), the reference (differentiable)
    implementation runs instead.
    """
    fp32 = takes_fp32_params(backend, "glu_conv1d_step", _MODULE, x_t)
    x_t, state, weight, bias = entry_prologue("x_t", x_t, 2, state, weight, bias, params=2, fp32_params=fp32)
    batch, channels = x_t.shape
    k = _check_weight(weight, x_t, channels, fp32)
    check_tensor("state", state, shape=(batch, k - 1, channels), like=x_t)
    check_optional("bias", bias, shape=(2 * channels,), like=x_t, or_float32=fp32)
    residual = check_bool("residual", residual)
    scale = check_number("scale", scale)

    backend = resolve_backend(backend, "glu_conv1d_step", x_t.device, x_t.dtype)
    tensors = (x_t, state, weight, bias)
    if backend == "reference" or records_grad(*tensors) or has_tangent(*tensors):
        if backend != "reference":
            warn_cuda_reference("glu_conv1d_step", x_t.device, "the step kernel is forward-only and autograd is "
                                "recording (or an input carries a forward-mode tangent)")
        weight, bias = cast_floating(x_t.dtype, weight, bias)
        return reference.glu_conv1d_step(x_t, state, weight, bias, residual=residual, scale=scale)
    return kernel(backend, _MODULE, "glu_conv1d_step")(x_t, state, weight, bias, residual, scale)


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("glu_conv1d", lambda d, b: ((d.randn(b, 9, 8), d.randn(16, 8, 3, scale=0.2)), {"causal": True}), grads=(0, 1))
example("glu_conv1d_step", lambda d, b: ((d.randn(b, 8), d.randn(b, 2, 8), d.randn(16, 8, 3, scale=0.2)), {}))
