"""Multi-head self-attention over padded sequences, on a fused qkv projection: autograd Function + dispatch.

Kernels (the C++ CPU backend; there is no Triton kernel: on a GPU, ``backend="auto"`` runs the reference,
i.e. torch's own fused scaled-dot-product attention)::

    fastqa::self_attention_fwd(qkv, mask, heads, segments?) -> (out, lse)
    fastqa::self_attention_bwd(grad_out, qkv, mask, out, lse, heads, segments?) -> grad_qkv

``lse`` [B, heads, L] (each query row's log-sum-exp) is what the backward needs besides the inputs and the
output; the Function saves it and hands it back unread.
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch

from .. import reference
from .._backend import cpu_available, resolve_backend
from .._checks import check_tensor, entry_prologue
from ._function import has_tangent, input_grads, once_differentiable, register_op_autograd
from ._registry import kernel, qualified, register_autograd_hook

_MODULE = "self_attention"

__all__ = ["self_attention"]

_SA_INPUTS = ("backend", "qkv", "mask", "heads", "segments")
_SA_OP_INPUTS = _SA_INPUTS[1:]


def _sa_save(ctx, backend: str, inputs: tuple, out: torch.Tensor, lse: torch.Tensor) -> None:
    qkv, mask, heads, segments = inputs
    ctx.save_for_backward(qkv, mask, out, lse)
    ctx.backend, ctx.heads, ctx.segments = backend, heads, segments


def _sa_grads(ctx, grad_out: torch.Tensor) -> dict:
    qkv, mask, out, lse = ctx.saved_tensors
    grad_qkv = kernel(ctx.backend, _MODULE, "self_attention_bwd")(grad_out, qkv, mask, out, lse, ctx.heads,
                                                                  ctx.segments)
    return {"qkv": grad_qkv}


class _SelfAttentionFunction(torch.autograd.Function):
    """softmax(q kᵀ / sqrt(D) + mask) v through a backend's fused kernels."""

    @staticmethod
    def forward(ctx, backend: str, qkv: torch.Tensor, mask: torch.Tensor, heads: int,
                segments: list[int] | None) -> torch.Tensor:
        out, lse = kernel(backend, _MODULE, "self_attention_fwd")(qkv, mask, heads, segments)
        _sa_save(ctx, backend, (qkv, mask, heads, segments), out, lse)
        return out

    @staticmethod
    @once_differentiable("self_attention")
    def backward(ctx, grad_out: torch.Tensor):
        return input_grads(ctx, _SA_INPUTS, **_sa_grads(ctx, grad_out))


def _register_autograd(backend: str) -> None:
    """The Function's formula on ``fastqa::self_attention_fwd`` itself (graphs that call the op: torch.export)."""
    if backend != "cpu":
        return  # no Triton kernel

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        _sa_save(ctx, backend, inputs, output[0], output[1])

    def backward(ctx, grad_out, _grad_lse):
        return input_grads(ctx, _SA_OP_INPUTS, **_sa_grads(ctx, grad_out))

    register_op_autograd(qualified(backend, "self_attention_fwd"), "self_attention", setup_context, backward)


def self_attention(qkv: torch.Tensor, mask: torch.Tensor, heads: int, *, segments: Sequence[int] | None = None,
                   backend: str = "auto") -> torch.Tensor:
    """Multi-head scaled-dot-product self-attention over a sequence with padding.

    qkv: [B, L, 3C], the output of one nn.Linear(C, 3C) as it is: q = qkv[..., :C], k = qkv[..., C:2C],
    v = qkv[..., 2C:], head h in channels [h*D, (h+1)*D) of each, D = C / heads.
    mask: [B, L] bool, True = a real position (padding False): the keys to attend to, and the query rows
    computed -- padded query rows give zeros (and pass no gradient), so the kernel skips them; a sequence
    with no real position attends to every key from every row.
    Returns [B, L, C]: softmax(q kᵀ / sqrt(D) + mask) v per head, heads side by side (ready for the output
    projection; ``F.scaled_dot_product_attention`` on the [B, heads, L, D] views, padded rows zeroed).
    segments: lengths summing to L that cut every row into sequences attended apart (a packed batch: several
    sequences one after another in one row); None: each row is one sequence.
    backend: "auto", "reference" or "cpu" (no Triton kernel: on CUDA, "auto" runs the reference, torch's
    fused attention).
    """
    qkv, = entry_prologue("qkv", qkv, 3)
    if isinstance(heads, bool) or not isinstance(heads, numbers.Integral) or heads <= 0:
        raise ValueError(f"heads must be a positive int, got {heads!r}")
    if qkv.shape[2] % (3 * heads):
        raise ValueError(f"qkv's last dimension must be 3 * C with C a multiple of heads={heads}, "
                         f"got shape {tuple(qkv.shape)}")
    check_tensor("mask", mask, shape=qkv.shape[:2], dtype=torch.bool, floating=False, like=qkv)
    segments = reference.check_segments(segments, qkv.shape[1])
    if backend == "triton":
        raise ValueError("fastqa.self_attention has no Triton kernel: on a GPU, backend='auto' (or "
                         "'reference') runs torch's fused scaled-dot-product attention")
    resolved = resolve_backend(backend, "self_attention", qkv.device, qkv.dtype)
    if resolved != "cpu" or has_tangent(qkv):
        return reference.self_attention(qkv, mask, int(heads), segments)
    return _SelfAttentionFunction.apply(resolved, qkv, mask, int(heads), segments)


register_autograd_hook(_MODULE, _register_autograd)

if cpu_available():
    @torch.library.register_fake("fastqa::self_attention_fwd")
    def _fwd_fake(qkv, mask, heads, segments=None):
        b, length, c3 = qkv.shape
        return qkv.new_empty((b, length, c3 // 3)), qkv.new_empty((b, heads, length))

    @torch.library.register_fake("fastqa::self_attention_bwd")
    def _bwd_fake(grad_out, qkv, mask, out, lse, heads, segments=None):
        return qkv.new_empty(qkv.shape)
