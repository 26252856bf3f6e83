"""Multi-head self-attention over padded sequences, on a fused qkv projection: autograd Function + dispatch.

Kernels (the C++ CPU backend)::

    fastqa::self_attention_fwd(qkv, mask, heads, segments?) -> (out, lse)
    fastqa::self_attention_bwd(grad_out, qkv, mask, out, lse, heads, segments?) -> grad_qkv

``lse`` [B, heads, L] (each query row's log-sum-exp) is what the backward needs besides the inputs and the
output; the Function saves it and hands it back unread. It is float32 for a bfloat16 qkv (a softmax statistic
keeps the precision it was computed in).

The GPU backend ("triton": CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``) has no kernel of its
own: ``packed_attention`` runs torch's fused scaled-dot-product attention (flash / memory-efficient kernels)
in ONE call whatever the segments, with no host synchronisation. A packed row's segments are regrouped into
a padded batch [B * S, max segment, 3C] by a gather whose indices are built on the device from one
pinned, non-blocking copy of the segment lengths; the reference instead loops over the segments in Python,
one attention call each.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .. import reference
from .._backend import resolve_backend, warn_cuda_reference
from .._checks import check_int, check_tensor, entry_prologue
from ._declare import OpDecl, declare, example
from ._function import has_tangent
from ._registry import cpu_statistics_dtype, kernel

_MODULE = "self_attention"

__all__ = ["self_attention"]


def _save(ctx, inputs: tuple, outputs: tuple) -> None:
    qkv, mask, heads, segments = inputs
    ctx.save_for_backward(qkv, mask, *outputs)   # out, lse
    ctx.heads, ctx.segments = heads, segments


def _grads(ctx, grad_out: torch.Tensor) -> dict:
    qkv, mask, out, lse = ctx.saved_tensors
    grad_qkv = kernel(ctx.backend, _MODULE, "self_attention_bwd")(grad_out, qkv, mask, out, lse, ctx.heads,
                                                                  ctx.segments)
    return {"qkv": grad_qkv}


def _fwd_fake(qkv, mask, heads, segments=None):
    b, length, c3 = qkv.shape
    lse = qkv.new_empty((b, heads, length), dtype=cpu_statistics_dtype(qkv.dtype))
    return qkv.new_empty((b, length, c3 // 3)), lse


def _bwd_fake(grad_out, qkv, mask, out, lse, heads, segments=None):
    return qkv.new_empty(qkv.shape)


# softmax(q kᵀ / sqrt(D) + mask) v through the C++ kernels (the GPU path is torch's own attention).
_SELF_ATTENTION = declare(OpDecl("self_attention", _MODULE, ("qkv", "mask", "heads", "segments"), _grads, _save,
                                 fakes={"self_attention_fwd": _fwd_fake, "self_attention_bwd": _bwd_fake},
                                 backends=("cpu",)))


def self_attention(qkv: torch.Tensor, mask: torch.Tensor, heads: int, *, segments: Sequence[int] | None = None,
                   backend: str = "auto") -> torch.Tensor:
    """Multi-head scaled-dot-product self-attention over a sequence with padding.

    qkv: [B, L, 3C], the output of one nn.Linear(C, 3C) as it is: q = qkv[..., :C], k = qkv[..., C:2C],
    v = qkv[..., 2C:], head h in channels [h*D, (h+1)*D) of each, D = C / heads.
    mask: [B, L] bool, True = a real position (padding False): the keys to attend to, and the query rows
    computed -- padded query rows give zeros (and pass no gradient), so the kernel skips them; a sequence
    (a row, or a segment) with no real position gives zeros throughout, never NaN, on every backend.
    Returns [B, L, C]: softmax(q kᵀ / sqrt(D) + mask) v per head, heads side by side (ready for the output
    projection; ``F.scaled_dot_product_attention`` on the [B, heads, L, D] views, padded rows zeroed).
    segments: lengths summing to L that cut every row into sequences attended apart (a packed batch: several
    sequences one after another in one row); None: each row is one sequence. Not a sequence: a TypeError
    naming ``segments``; lengths that are not positive ints summing to L: a ValueError naming it.
    backend: "auto", "reference", "cpu" or "triton" (the GPU path, ``packed_attention``: torch's fused
    attention in one call; what "auto" runs on CUDA).
    """
    qkv, = entry_prologue("qkv", qkv, 3)
    heads = check_int("heads", heads, low=1, expected="a positive int", error=ValueError)
    if qkv.shape[2] % (3 * heads):
        raise ValueError(f"qkv's last dimension must be 3 * C with C a multiple of heads={heads}, "
                         f"got shape {tuple(qkv.shape)}")
    check_tensor("mask", mask, shape=qkv.shape[:2], dtype=torch.bool, floating=False, like=qkv)
    segments = reference.check_segments(segments, qkv.shape[1])
    resolved = resolve_backend(backend, "self_attention", qkv.device, qkv.dtype)
    if resolved == "reference" or has_tangent(qkv):
        if resolved != "reference":
            warn_cuda_reference("self_attention", qkv.device, "an input carries a forward-mode tangent")
        return reference.self_attention(qkv, mask, heads, segments)
    if resolved == "triton":
        return packed_attention(qkv, mask, heads, segments)
    return _SELF_ATTENTION.call(resolved, qkv, mask, heads, segments)


def _device_lengths(segments: Sequence[int], device: torch.device) -> torch.Tensor:
    """segments as an int64 tensor on ``device``. To a GPU through pinned memory and a non-blocking copy: a
    blocking copy from pageable memory would synchronise the host with the stream."""
    lengths = torch.tensor(segments, dtype=torch.int64)
    if device.type != "cuda":
        return lengths.to(device)
    return lengths.pin_memory().to(device, non_blocking=True)


def packed_attention(qkv: torch.Tensor, mask: torch.Tensor, heads: int,
                     segments: Sequence[int] | None = None) -> torch.Tensor:
    """The GPU path of ``self_attention`` (arguments as there, already checked): one fused attention call,
    no host synchronisation, differentiable by torch's autograd; the values of the reference.

    qkv: [B, L, 3C]; mask: [B, L] bool; segments: S lengths summing to L, or None. With segments, position p
    of segment s (starting at row start_s) goes to row t = p - start_s of sequence (b, s) of a padded batch
    [B * S, T, 3C] (T the longest segment; slots past a segment's end read a zero row and are masked), the
    reference's unsegmented attention runs on that batch, and the outputs are gathered back
    to [B, L, C]. Every index is computed on the device; the host only knows S and T. Returns [B, L, C].
    A segment without a real position gives zeros, as in the reference: its rows are padding rows, which the
    reference's attention zeroes whatever its slots attend to.
    """
    if segments is None or len(segments) == 1:
        return reference.self_attention(qkv, mask, heads)
    b, length, c3 = qkv.shape
    count, longest = len(segments), max(segments)
    device = qkv.device
    lengths = _device_lengths(segments, device)                                 # [S]
    starts = torch.cumsum(lengths, 0) - lengths                                 # [S]
    slot = torch.arange(longest, device=device)                                 # [T]
    valid = slot < lengths.unsqueeze(1)                                         # [S, T]
    # Slots past a segment's end gather row L: a zero row appended to qkv (and a False one to the mask).
    rows = torch.where(valid, starts.unsqueeze(1) + slot, length).flatten()    # [S * T]
    padded_qkv = torch.cat([qkv, qkv.new_zeros(b, 1, c3)], dim=1).index_select(1, rows)
    padded_mask = torch.cat([mask, mask.new_zeros(b, 1)], dim=1).index_select(1, rows).view(b * count, longest)
    out = reference.self_attention(padded_qkv.view(b * count, longest, c3), padded_mask, heads)   # [B*S, T, C]
    # Position p sits in slot (segment of p) * T + (p - start of its segment) of the flattened [S * T].
    segment_of = torch.repeat_interleave(torch.arange(count, device=device), lengths, output_size=length)
    back = segment_of * longest + torch.arange(length, device=device) - starts[segment_of]   # [L]
    return out.view(b, count * longest, c3 // 3).index_select(1, back)


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("self_attention", lambda d, b: ((d.randn(b, 6, 12), d.mask(b, 6), 2), {}), grads=(0,))
