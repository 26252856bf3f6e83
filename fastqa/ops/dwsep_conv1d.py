"""Fused depthwise-separable conv1d: autograd Function, backend dispatch and the functional entry point.

y = act(pointwise(depthwise(x) + dw_bias) + pw_bias) + residual, on channels-last [B, L, C] data, as
``fastqa.reference.dwsep_conv1d``. The compiled backends expose ``<ns>::dwsep_conv1d_fwd`` ->
(y, aux) and ``<ns>::dwsep_conv1d_bwd`` with identical schemas; aux is whatever the backend's
backward needs (the CPU kernel: the bool ReLU mask, or an empty tensor without ReLU) and is passed
back unread.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .._backend import cpu_available, resolve_backend
from .._checks import check_device, check_nonempty_batch, check_optional, check_positive, check_tensor
from ..reference.dwsep_conv1d import ACTIVATIONS, PADDINGS, conv_padding
from ..reference.dwsep_conv1d import dwsep_conv1d as dwsep_conv1d_reference
from ._registry import autocast_dtype, cast_floating, kernel, none_if_empty

_MODULE = "dwsep_conv1d"

__all__ = ["dwsep_conv1d"]


class _DwsepConv1dFunction(torch.autograd.Function):
    """Backend-agnostic: the kernels come from ``kernel(backend, ...)``, aux is saved unread."""

    @staticmethod
    def forward(ctx, backend: str, x: torch.Tensor, dw_weight: torch.Tensor, dw_bias: torch.Tensor | None,
                pw_weight: torch.Tensor, pw_bias: torch.Tensor | None, residual: torch.Tensor | None,
                pad_left: int, relu: bool) -> torch.Tensor:
        y, aux = kernel(backend, _MODULE, "dwsep_conv1d_fwd")(
            x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu)
        ctx.save_for_backward(x, dw_weight, dw_bias, pw_weight, pw_bias, aux)
        ctx.backend, ctx.pad_left, ctx.relu = backend, pad_left, relu
        return y

    @staticmethod
    @once_differentiable  # the _bwd kernels have no derivative of their own: double backward raises
    def backward(ctx, grad_y: torch.Tensor):
        x, dw_weight, dw_bias, pw_weight, pw_bias, aux = ctx.saved_tensors
        _, need_x, need_dw, need_db, need_pw, need_pb, need_res, _, _ = ctx.needs_input_grad
        grad_x = grad_dw = grad_db = grad_pw = grad_pb = None
        if need_x or need_dw or need_db or need_pw or need_pb:
            grad_x, grad_dw, grad_db, grad_pw, grad_pb = kernel(ctx.backend, _MODULE, "dwsep_conv1d_bwd")(
                grad_y.contiguous(), x, dw_weight, dw_bias, pw_weight, pw_bias, aux, ctx.pad_left, ctx.relu)
        # The residual enters additively after the activation: its gradient is grad_y itself.
        return (None,
                grad_x if need_x else None,
                grad_dw if need_dw else None,
                none_if_empty(grad_db) if need_db else None,
                grad_pw if need_pw else None,
                none_if_empty(grad_pb) if need_pb else None,
                grad_y if need_res else None,
                None, None)


def dwsep_conv1d(
    x: torch.Tensor,
    dw_weight: torch.Tensor,
    pw_weight: torch.Tensor,
    pw_bias: torch.Tensor | None = None,
    *,
    dw_bias: torch.Tensor | None = None,
    padding: str = "same",
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Depthwise conv (kernel K, zero padding) -> pointwise 1x1 conv -> bias -> activation -> + residual.

    x: [B, L, C_in] (any strides; channels-first data may be passed as ``xc.transpose(1, 2)``);
    dw_weight: [C_in, 1, K]; pw_weight: [C_out, C_in, 1]; pw_bias: [C_out]; dw_bias: [C_in];
    residual: [B, L, C_out]; padding: "same" (as nn.Conv1d, an even K's extra zero goes right) or
    "causal" (K-1 zeros left); activation: None or "relu"; backend: "auto", "reference", "cpu", "triton".
    Returns y: [B, L, C_out].
    """
    check_tensor("x", x, ndim=3)
    check_device("x", x)
    x, dw_weight, pw_weight, pw_bias, dw_bias, residual = cast_floating(
        autocast_dtype(x.device), x, dw_weight, pw_weight, pw_bias, dw_bias, residual)
    check_nonempty_batch("x", x)
    check_positive("x", x, (1, 2))
    _, length, c_in = x.shape
    check_tensor("dw_weight", dw_weight, shape=(c_in, 1, None), like=x)
    check_positive("dw_weight", dw_weight, (2,))
    check_tensor("pw_weight", pw_weight, shape=(None, c_in, 1), like=x)
    check_positive("pw_weight", pw_weight, (0,))
    c_out = pw_weight.shape[0]
    check_optional("pw_bias", pw_bias, shape=(c_out,), like=x)
    check_optional("dw_bias", dw_bias, shape=(c_in,), like=x)
    check_optional("residual", residual, shape=(x.shape[0], length, c_out), like=x)
    if not isinstance(padding, str) or padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")

    resolved = resolve_backend(backend, "dwsep_conv1d", x.device, x.dtype)
    if resolved == "reference":
        return dwsep_conv1d_reference(x, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias, padding=padding,
                                      activation=activation, residual=residual)
    pad_left, _ = conv_padding(dw_weight.shape[-1], padding)
    return _DwsepConv1dFunction.apply(resolved, x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left,
                                      activation == "relu")


if cpu_available():
    # Shapes only, for torch.compile / opcheck; must match the C++ kernels' outputs (all contiguous).
    @torch.library.register_fake("fastqa::dwsep_conv1d_fwd")
    def _dwsep_conv1d_fwd_fake(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu):
        batch, length, _ = x.shape
        y = x.new_empty(batch, length, pw_weight.shape[0])
        aux = x.new_empty(y.shape if relu else (0,), dtype=torch.bool)
        return y, aux

    @torch.library.register_fake("fastqa::dwsep_conv1d_bwd")
    def _dwsep_conv1d_bwd_fake(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu):
        return (x.new_empty(x.shape),
                dw_weight.new_empty(dw_weight.shape),
                x.new_empty(dw_bias.shape if dw_bias is not None else (0,)),
                pw_weight.new_empty(pw_weight.shape),
                x.new_empty(pw_bias.shape if pw_bias is not None else (0,)))
