"""Fused depthwise-separable conv1d: autograd Functions, backend dispatch and the functional entry points.

y = act(pointwise(depthwise(x) + dw_bias) + pw_bias) + residual, on channels-last [B, L, C] data, as
``fastqa.reference.dwsep_conv1d``. The compiled backends expose ``<ns>::dwsep_conv1d_fwd`` ->
(y, aux) and ``<ns>::dwsep_conv1d_bwd`` with identical schemas; aux is whatever the backend's
backward needs (the CPU kernel: the bool ReLU mask, or an empty tensor without ReLU) and is passed
back unread.

``ln_dwsep_conv1d`` puts a LayerNorm over the channels in front (QANet's whole conv sublayer,
y = act(pw(dw(LN(x)))) + residual), as ``<ns>::ln_dwsep_conv1d_fwd`` -> (y, aux, ln_stats) and
``..._bwd`` on both compiled backends (Triton fuses everything; the C++ kernel normalises into a
buffer for the call and runs its dwsep kernels on it, and reduces the LayerNorm's weight and bias
gradients in fixed row blocks, so they too are the same bits for any thread count).

Both take an optional row ``mask`` [B, L] bool (False = padding): those rows enter the depthwise conv as
zeros -- after the LayerNorm in ``ln_dwsep_conv1d``, whose kernels read the mask themselves -- so the
outputs at real rows do not depend on how much padding follows them. ``dwsep_conv1d`` zeroes the rows of
x before its kernel (one masked_fill: nothing to normalise first).
"""
from __future__ import annotations

import math

import torch

from .._backend import cpu_available, resolve_backend, warn_cuda_reference
from .._checks import (cast_floating, check_choice, check_number, check_optional, check_positive, check_tensor,
                       entry_prologue)
from ..reference.dwsep_conv1d import ACTIVATIONS, PADDINGS, conv_padding
from ..reference.dwsep_conv1d import dwsep_conv1d as dwsep_conv1d_reference
from ..reference.dwsep_conv1d import ln_dwsep_conv1d as ln_dwsep_conv1d_reference
from ._function import exporting, has_tangent, input_grads, once_differentiable, register_op_autograd, wants
from ._registry import cpu_statistics_dtype, exported_op, kernel, qualified, register_autograd_hook, takes_fp32_params

_MODULE = "dwsep_conv1d"

__all__ = ["dwsep_conv1d", "ln_dwsep_conv1d"]


# Forward inputs of the Functions, in order (see fastqa.ops._function).
_DWSEP_INPUTS = ("backend", "x", "dw_weight", "pw_weight", "pw_bias", "dw_bias", "residual", "residual_is_x",
                 "pad_left", "relu")


# The inputs of the custom op ns::dwsep_conv1d_fwd, in order (its autograd formula, _register_autograd).
_DWSEP_OP_INPUTS = ("x", "dw_weight", "dw_bias", "pw_weight", "pw_bias", "residual", "pad_left", "relu")
# The gradients the dwsep_conv1d_bwd op returns, in order.
_DWSEP_GRADS = ("x", "dw_weight", "dw_bias", "pw_weight", "pw_bias")


def _save_scalars(ctx, backend: str, pad_left: int, relu: bool, residual_is_x: bool) -> None:
    ctx.backend, ctx.pad_left, ctx.relu, ctx.residual_is_x = backend, pad_left, relu, residual_is_x


def _dwsep_save(ctx, backend: str, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left: int, relu: bool,
                residual_is_x: bool = False) -> None:
    ctx.save_for_backward(x, dw_weight, dw_bias, pw_weight, pw_bias, aux)
    _save_scalars(ctx, backend, pad_left, relu, residual_is_x)


def _dwsep_grads(ctx, grad_y: torch.Tensor) -> tuple:
    """The dwsep_conv1d_bwd kernel's gradients, in _DWSEP_GRADS order."""
    x, dw_weight, dw_bias, pw_weight, pw_bias, aux = ctx.saved_tensors
    return kernel(ctx.backend, _MODULE, "dwsep_conv1d_bwd")(
        grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, ctx.pad_left, ctx.relu)


def _backward(ctx, grad_y: torch.Tensor, kernel_grads, grad_names: tuple, inputs: tuple) -> tuple:
    """The backward of both Functions and both op formulas: ``kernel_grads(ctx, grad_y)`` (gradients in
    ``grad_names`` order) runs only if autograd wants one of them; the residual enters additively after
    the activation, so its gradient is grad_y itself, and x's gets grad_y too where the residual is x
    (``ctx.residual_is_x``). Returns the gradients of ``inputs``, in order."""
    grads = {}
    if wants(ctx, inputs, *grad_names):
        grads = dict(zip(grad_names, kernel_grads(ctx, grad_y)))
    grads["residual"] = grad_y
    if ctx.residual_is_x and "x" in grads:
        grads["x"] = grads["x"] + grad_y
    return input_grads(ctx, inputs, **grads)


class _DwsepConv1dFunction(torch.autograd.Function):
    """Backend-agnostic: the kernels come from ``kernel(backend, ...)``, aux is saved unread.

    ``residual_is_x``: ``dwsep_conv1d(x, ..., residual=x)``. Dynamo cannot trace an autograd.Function
    given the same tensor twice, so x is then passed once (residual None) and its gradient gets grad_y here.
    """

    @staticmethod
    def forward(ctx, backend: str, x: torch.Tensor, dw_weight: torch.Tensor, pw_weight: torch.Tensor,
                pw_bias: torch.Tensor | None, dw_bias: torch.Tensor | None, residual: torch.Tensor | None,
                residual_is_x: bool, pad_left: int, relu: bool) -> torch.Tensor:
        y, aux = kernel(backend, _MODULE, "dwsep_conv1d_fwd")(
            x, dw_weight, dw_bias, pw_weight, pw_bias, x if residual_is_x else residual, pad_left, relu)
        _dwsep_save(ctx, backend, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu, residual_is_x)
        return y

    @staticmethod
    @once_differentiable("dwsep_conv1d")
    def backward(ctx, grad_y: torch.Tensor):
        return _backward(ctx, grad_y, _dwsep_grads, _DWSEP_GRADS, _DWSEP_INPUTS)


def _check_conv_args(x: torch.Tensor, dw_weight: torch.Tensor, pw_weight: torch.Tensor,
                     pw_bias: torch.Tensor | None, dw_bias: torch.Tensor | None, residual: torch.Tensor | None,
                     padding: str, activation: str | None, mask: torch.Tensor | None, fp32: bool) -> None:
    """The checks shared by ``dwsep_conv1d`` and ``ln_dwsep_conv1d``, after ``entry_prologue`` (fp32: its
    ``fp32_params``, float32 parameters accepted)."""
    _, length, c_in = x.shape
    check_tensor("dw_weight", dw_weight, shape=(c_in, 1, None), like=x, or_float32=fp32)
    check_positive("dw_weight", dw_weight, (2,))
    check_tensor("pw_weight", pw_weight, shape=(None, c_in, 1), like=x, or_float32=fp32)
    check_positive("pw_weight", pw_weight, (0,))
    c_out = pw_weight.shape[0]
    check_optional("pw_bias", pw_bias, shape=(c_out,), like=x, or_float32=fp32)
    check_optional("dw_bias", dw_bias, shape=(c_in,), like=x, or_float32=fp32)
    check_optional("residual", residual, shape=(x.shape[0], length, c_out), like=x)
    check_optional("mask", mask, shape=(x.shape[0], length), dtype=torch.bool, floating=False, like=x)
    check_choice("padding", padding, PADDINGS)
    check_choice("activation", activation, ACTIVATIONS)


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
    mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Depthwise conv (kernel K, zero padding) -> pointwise 1x1 conv -> bias -> activation -> + residual.

    x: [B, L, C_in] (any strides; channels-first data may be passed as ``xc.transpose(1, 2)``);
    dw_weight: [C_in, 1, K]; pw_weight: [C_out, C_in, 1]; pw_bias: [C_out]; dw_bias: [C_in];
    residual: [B, L, C_out]; mask: [B, L] bool, False = padding (read as zeros by the conv, so real rows
    never see it; the residual is added unmasked); padding: "same" (as nn.Conv1d, an even K's extra zero
    goes right) or "causal" (K-1 zeros left); activation: None or "relu"; backend: "auto", "reference",
    "cpu", "triton". Returns y: [B, L, C_out].
    """
    fp32 = takes_fp32_params(backend, "dwsep_conv1d", _MODULE, x)
    x, residual, dw_weight, pw_weight, pw_bias, dw_bias = entry_prologue(
        "x", x, 3, residual, dw_weight, pw_weight, pw_bias, dw_bias, params=4, fp32_params=fp32)
    _check_conv_args(x, dw_weight, pw_weight, pw_bias, dw_bias, residual, padding, activation, mask, fp32)

    resolved = resolve_backend(backend, "dwsep_conv1d", x.device, x.dtype)
    if resolved == "reference" or has_tangent(x, dw_weight, pw_weight, pw_bias, dw_bias, residual):
        if resolved != "reference":
            warn_cuda_reference("dwsep_conv1d", x.device, "an input carries a forward-mode tangent")
        dw_weight, pw_weight, pw_bias, dw_bias = cast_floating(x.dtype, dw_weight, pw_weight, pw_bias, dw_bias)
        return dwsep_conv1d_reference(x, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias, padding=padding,
                                      activation=activation, residual=residual, mask=mask)
    if mask is not None:  # the residual stays the unmasked x
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
    pad_left, _ = conv_padding(dw_weight.shape[-1], padding)
    residual_is_x = residual is x
    if exporting():   # the op and the formula registered on it (see exporting())
        return exported_op(resolved, "dwsep_conv1d_fwd")(x, dw_weight, dw_bias, pw_weight, pw_bias, residual,
                                                         pad_left, activation == "relu")[0]
    return _DwsepConv1dFunction.apply(resolved, x, dw_weight, pw_weight, pw_bias, dw_bias,
                                      None if residual_is_x else residual, residual_is_x, pad_left,
                                      activation == "relu")


_LN_DWSEP_INPUTS = ("backend", "x", "ln_weight", "ln_bias", "dw_weight", "pw_weight", "pw_bias", "dw_bias",
                    "residual", "residual_is_x", "mask", "eps", "pad_left", "relu")


# The gradients the ln_dwsep_conv1d_bwd op returns, in order.
_LN_DWSEP_GRADS = ("x", "ln_weight", "ln_bias", "dw_weight", "dw_bias", "pw_weight", "pw_bias")


# The inputs of the custom op fastqa_triton::ln_dwsep_conv1d_fwd, in order.
_LN_DWSEP_OP_INPUTS = ("x", "ln_weight", "ln_bias", "eps", "dw_weight", "dw_bias", "pw_weight", "pw_bias",
                       "residual", "mask", "pad_left", "relu")


def _ln_dwsep_save(ctx, backend: str, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats,
                   mask, pad_left: int, relu: bool, residual_is_x: bool = False) -> None:
    # In the order of the ln_dwsep_conv1d_bwd kernel's arguments (after grad_y).
    ctx.save_for_backward(x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats, mask)
    _save_scalars(ctx, backend, pad_left, relu, residual_is_x)


def _ln_dwsep_grads(ctx, grad_y: torch.Tensor) -> tuple:
    """The ln_dwsep_conv1d_bwd kernel's gradients, in _LN_DWSEP_GRADS order."""
    # The kernel reads grad_y through its strides and never writes it.
    return kernel(ctx.backend, _MODULE, "ln_dwsep_conv1d_bwd")(grad_y, *ctx.saved_tensors, ctx.pad_left, ctx.relu)


class _LnDwsepConv1dFunction(torch.autograd.Function):
    """The pre-LayerNorm variant; aux (ReLU mask) and ln_stats (row mean, 1/std) are saved
    unread.

    ``residual_is_x``: QANet adds the sublayer's own input back. Dynamo cannot trace an autograd.Function
    given the same tensor twice, so x is then passed once (residual None) and its gradient gets grad_y here.
    """

    @staticmethod
    def forward(ctx, backend: str, x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor,
                dw_weight: torch.Tensor, pw_weight: torch.Tensor, pw_bias: torch.Tensor | None,
                dw_bias: torch.Tensor | None, residual: torch.Tensor | None, residual_is_x: bool,
                mask: torch.Tensor | None, eps: float, pad_left: int, relu: bool) -> torch.Tensor:
        y, aux, ln_stats = kernel(backend, _MODULE, "ln_dwsep_conv1d_fwd")(
            x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias, x if residual_is_x else residual,
            mask, pad_left, relu)
        _ln_dwsep_save(ctx, backend, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats,
                       mask, pad_left, relu, residual_is_x)
        return y

    @staticmethod
    @once_differentiable("ln_dwsep_conv1d")
    def backward(ctx, grad_y: torch.Tensor):
        return _backward(ctx, grad_y, _ln_dwsep_grads, _LN_DWSEP_GRADS, _LN_DWSEP_INPUTS)


def _register_autograd(backend: str) -> None:
    """The Functions' formulas on ``<ns>::dwsep_conv1d_fwd`` and ``<ns>::ln_dwsep_conv1d_fwd`` themselves:
    graphs that call the ops (torch.export) train too."""
    def dwsep_setup(ctx, inputs, output):
        x, dw_weight, dw_bias, pw_weight, pw_bias, _, pad_left, relu = inputs
        ctx.mark_non_differentiable(output[1])
        _dwsep_save(ctx, backend, x, dw_weight, dw_bias, pw_weight, pw_bias, output[1], pad_left, relu)

    def dwsep_backward(ctx, grad_y, _grad_aux):
        return _backward(ctx, grad_y, _dwsep_grads, _DWSEP_GRADS, _DWSEP_OP_INPUTS)

    register_op_autograd(qualified(backend, "dwsep_conv1d_fwd"), "dwsep_conv1d", dwsep_setup, dwsep_backward)

    def ln_setup(ctx, inputs, output):
        x, ln_weight, ln_bias, _, dw_weight, dw_bias, pw_weight, pw_bias, _, mask, pad_left, relu = inputs
        _, aux, ln_stats = output
        ctx.mark_non_differentiable(aux, ln_stats)
        _ln_dwsep_save(ctx, backend, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats,
                       mask, pad_left, relu)

    def ln_backward(ctx, grad_y, _grad_aux, _grad_stats):
        return _backward(ctx, grad_y, _ln_dwsep_grads, _LN_DWSEP_GRADS, _LN_DWSEP_OP_INPUTS)

    register_op_autograd(qualified(backend, "ln_dwsep_conv1d_fwd"), "ln_dwsep_conv1d", ln_setup, ln_backward)


def ln_dwsep_conv1d(
    x: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    dw_weight: torch.Tensor,
    pw_weight: torch.Tensor,
    pw_bias: torch.Tensor | None = None,
    *,
    dw_bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    padding: str = "same",
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """LayerNorm over the channels -> depthwise conv -> pointwise conv -> bias -> activation -> + residual.

    QANet's conv sublayer in one call: ``ln_dwsep_conv1d(x, ..., residual=x, mask=mask)``. x: [B, L, C_in]
    (any strides); ln_weight, ln_bias: [C_in]; eps: positive float; the other arguments as ``dwsep_conv1d``
    (the zero padding and the mask come after the LayerNorm: masked rows of LN(x) are zero). Returns
    y: [B, L, C_out].

    Backends: "triton" fuses everything (LN(x) is never stored: the row statistics are, [B, 2, L]);
    "cpu" normalises into a [B, L, C_in] buffer that lives for the call only (forward, and rebuilt
    in backward from x and the saved row statistics) and runs the ``dwsep_conv1d`` CPU kernels on it;
    "reference" is ``fastqa.reference.ln_dwsep_conv1d``.
    """
    fp32 = takes_fp32_params(backend, "ln_dwsep_conv1d", _MODULE, x)
    x, residual, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias = entry_prologue(
        "x", x, 3, residual, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, params=6, fp32_params=fp32)
    _check_conv_args(x, dw_weight, pw_weight, pw_bias, dw_bias, residual, padding, activation, mask, fp32)
    c_in = x.shape[2]
    check_tensor("ln_weight", ln_weight, shape=(c_in,), like=x, or_float32=fp32)
    check_tensor("ln_bias", ln_bias, shape=(c_in,), like=x, or_float32=fp32)
    eps = check_number("eps", eps, low=0, high=math.inf, low_open=True, high_open=True)

    resolved = resolve_backend(backend, "ln_dwsep_conv1d", x.device, x.dtype)
    if resolved == "reference" or has_tangent(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias, residual):
        if resolved != "reference":
            warn_cuda_reference("ln_dwsep_conv1d", x.device, "an input carries a forward-mode tangent")
        ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias = cast_floating(
            x.dtype, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias)
        return ln_dwsep_conv1d_reference(x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias,
                                         eps=eps, padding=padding, activation=activation, residual=residual,
                                         mask=mask)
    pad_left, _ = conv_padding(dw_weight.shape[-1], padding)
    relu = activation == "relu"
    residual_is_x = residual is x
    if exporting():   # the op and the formula registered on it (see exporting())
        return exported_op(resolved, "ln_dwsep_conv1d_fwd")(x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight,
                                                            pw_bias, residual, mask, pad_left, relu)[0]
    return _LnDwsepConv1dFunction.apply(resolved, x, ln_weight, ln_bias, dw_weight, pw_weight, pw_bias, dw_bias,
                                        None if residual_is_x else residual, residual_is_x, mask, eps, pad_left, relu)


register_autograd_hook(_MODULE, _register_autograd)

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
                x.new_empty((0,)) if dw_bias is None else dw_bias.new_empty(dw_bias.shape),
                pw_weight.new_empty(pw_weight.shape),
                x.new_empty((0,)) if pw_bias is None else pw_bias.new_empty(pw_bias.shape))

    @torch.library.register_fake("fastqa::ln_dwsep_conv1d_fwd")
    def _ln_dwsep_conv1d_fwd_fake(x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias, residual,
                                  mask, pad_left, relu):
        y, aux = _dwsep_conv1d_fwd_fake(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu)
        # ln_stats: row mean, 1/std
        return y, aux, x.new_empty(x.shape[0], 2, x.shape[1], dtype=cpu_statistics_dtype(x.dtype))

    @torch.library.register_fake("fastqa::ln_dwsep_conv1d_bwd")
    def _ln_dwsep_conv1d_bwd_fake(grad_y, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux,
                                  ln_stats, mask, pad_left, relu):
        return ((x.new_empty(x.shape), ln_weight.new_empty(ln_weight.shape), ln_bias.new_empty(ln_bias.shape))
                + _dwsep_conv1d_bwd_fake(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu)[1:])
