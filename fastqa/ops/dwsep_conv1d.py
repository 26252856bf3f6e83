"""Fused depthwise-separable conv1d: autograd Functions, backend dispatch and the functional entry points.

y = act(pointwise(depthwise(x) + dw_bias) + pw_bias) + residual, on channels-last [B, L, C] data, as
``fastqa.reference.dwsep_conv1d``. The compiled backends expose ``<ns>::dwsep_conv1d_fwd`` ->
(y, aux) and ``<ns>::dwsep_conv1d_bwd`` with identical schemas; aux is whatever the backend's
backward needs (the ReLU mask: bool on the CPU, packed bits in Triton; None without ReLU) and is passed
back unread. An absent bias's gradient is None too: no placeholder tensor is allocated.

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

from .._backend import resolve_backend, warn_cuda_reference
from .._checks import (cast_floating, check_choice, check_number, check_optional, check_positive, check_tensor,
                       entry_prologue)
from ..reference.dwsep_conv1d import ACTIVATIONS, PADDINGS, conv_padding
from ..reference.dwsep_conv1d import dwsep_conv1d as dwsep_conv1d_reference
from ..reference.dwsep_conv1d import ln_dwsep_conv1d as ln_dwsep_conv1d_reference
from ._declare import OpDecl, declare, example
from ._function import has_tangent, wants
from ._registry import cpu_statistics_dtype, kernel, takes_fp32_params

_MODULE = "dwsep_conv1d"

__all__ = ["dwsep_conv1d", "ln_dwsep_conv1d"]


# The gradients the backward ops return, in order.
_DWSEP_GRADS = ("x", "dw_weight", "dw_bias", "pw_weight", "pw_bias")
_LN_DWSEP_GRADS = ("x", "ln_weight", "ln_bias", "dw_weight", "dw_bias", "pw_weight", "pw_bias")


def _dwsep_save(ctx, inputs: tuple, outputs: tuple) -> None:
    x, dw_weight, dw_bias, pw_weight, pw_bias, _, pad_left, relu = inputs
    ctx.save_for_backward(x, dw_weight, dw_bias, pw_weight, pw_bias, outputs[1])   # aux
    ctx.pad_left, ctx.relu = pad_left, relu


def _dwsep_grads(ctx, grad_y: torch.Tensor) -> dict:
    """The kernel's gradients where autograd wants one of them; the residual enters additively after the
    activation, so its gradient is grad_y itself."""
    grads = {"residual": grad_y}
    if wants(ctx, ctx.input_names, *_DWSEP_GRADS):
        x, dw_weight, dw_bias, pw_weight, pw_bias, aux = ctx.saved_tensors
        grads.update(zip(_DWSEP_GRADS, kernel(ctx.backend, _MODULE, "dwsep_conv1d_bwd")(
            grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, ctx.pad_left, ctx.relu)))
    return grads


def _ln_dwsep_save(ctx, inputs: tuple, outputs: tuple) -> None:
    x, ln_weight, ln_bias, _, dw_weight, dw_bias, pw_weight, pw_bias, _, mask, pad_left, relu = inputs
    _, aux, ln_stats = outputs
    # In the order of the ln_dwsep_conv1d_bwd kernel's arguments (after grad_y).
    ctx.save_for_backward(x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats, mask)
    ctx.pad_left, ctx.relu = pad_left, relu


def _ln_dwsep_grads(ctx, grad_y: torch.Tensor) -> dict:
    """As ``_dwsep_grads``; the kernel reads grad_y through its strides and never writes it."""
    grads = {"residual": grad_y}
    if wants(ctx, ctx.input_names, *_LN_DWSEP_GRADS):
        grads.update(zip(_LN_DWSEP_GRADS, kernel(ctx.backend, _MODULE, "ln_dwsep_conv1d_bwd")(
            grad_y, *ctx.saved_tensors, ctx.pad_left, ctx.relu)))
    return grads


# Shapes only, for torch.compile / opcheck; must match the C++ kernels' outputs (all contiguous).
def _dwsep_conv1d_fwd_fake(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu):
    batch, length, _ = x.shape
    y = x.new_empty(batch, length, pw_weight.shape[0])
    aux = x.new_empty(y.shape, dtype=torch.bool) if relu else None
    return y, aux


def _dwsep_conv1d_bwd_fake(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu):
    return (x.new_empty(x.shape),
            dw_weight.new_empty(dw_weight.shape),
            None if dw_bias is None else dw_bias.new_empty(dw_bias.shape),
            pw_weight.new_empty(pw_weight.shape),
            None if pw_bias is None else pw_bias.new_empty(pw_bias.shape))


def _ln_dwsep_conv1d_fwd_fake(x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias, residual,
                              mask, pad_left, relu):
    y, aux = _dwsep_conv1d_fwd_fake(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu)
    # ln_stats: row mean, 1/std
    return y, aux, x.new_empty(x.shape[0], 2, x.shape[1], dtype=cpu_statistics_dtype(x.dtype))


def _ln_dwsep_conv1d_bwd_fake(grad_y, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux,
                              ln_stats, mask, pad_left, relu):
    return ((x.new_empty(x.shape), ln_weight.new_empty(ln_weight.shape), ln_bias.new_empty(ln_bias.shape))
            + _dwsep_conv1d_bwd_fake(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu)[1:])


# The residual may be x itself (QANet adds a sublayer's own input back): alias ("residual", "x").
_DWSEP = declare(OpDecl(
    "dwsep_conv1d", _MODULE, ("x", "dw_weight", "dw_bias", "pw_weight", "pw_bias", "residual", "pad_left", "relu"),
    _dwsep_grads, _dwsep_save, alias=("residual", "x"),
    fakes={"dwsep_conv1d_fwd": _dwsep_conv1d_fwd_fake, "dwsep_conv1d_bwd": _dwsep_conv1d_bwd_fake}))
_LN_DWSEP = declare(OpDecl(
    "ln_dwsep_conv1d", _MODULE, ("x", "ln_weight", "ln_bias", "eps", "dw_weight", "dw_bias", "pw_weight", "pw_bias",
                                 "residual", "mask", "pad_left", "relu"),
    _ln_dwsep_grads, _ln_dwsep_save, alias=("residual", "x"),
    fakes={"ln_dwsep_conv1d_fwd": _ln_dwsep_conv1d_fwd_fake, "ln_dwsep_conv1d_bwd": _ln_dwsep_conv1d_bwd_fake}))


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
    return _DWSEP.call(resolved, x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, activation == "relu")


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
    return _LN_DWSEP.call(resolved, x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias, residual,
                          mask, pad_left, relu)


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("dwsep_conv1d", lambda d, b: ((d.randn(b, 9, 8), d.randn(8, 1, 3, scale=0.5), d.randn(6, 8, 1, scale=0.3)),
                                      {"activation": "relu"}), grads=(0, 1, 2))
example("ln_dwsep_conv1d", lambda d, b: ((d.randn(b, 9, 8), 1 + d.randn(8, scale=0.1), d.randn(8, scale=0.1),
                                          d.randn(8, 1, 3, scale=0.5), d.randn(6, 8, 1, scale=0.3)), {}),
        grads=(0, 1, 2, 3, 4))
