"""Decode-time attention (a few query rows per batch element over that element's memory): dispatch.

Kernel (the C++ CPU backend, forward only; the GPU backend, "triton", has no kernel of its own: it runs
the batched GEMMs of the reference -- baddbmm, softmax, bmm on cuBLAS -- which need no host synchronisation
and are differentiable)::

    fastqa::decode_attention(q, keys, values, bias?, mask?, scale) -> (out, weights)

ConvS2S decoding attends one row per sentence (greedy) or per beam over the sentence's source at every
step. As batched GEMMs (baddbmm, softmax, bmm) that is B tiny products and three passes over the scores,
padding included; the kernel does one pass per sentence over the keys and values of its real positions
(measured: greedy decoding of 200 sentences 1.14x faster end to end).
"""
from __future__ import annotations

import torch

from .. import reference
from .._backend import cpu_available, resolve_backend
from .._checks import check_number, check_optional, check_positive, check_tensor, entry_prologue
from ._declare import example
from ._function import has_tangent, records_grad
from ._registry import kernel

_MODULE = "decode_attention"

__all__ = ["decode_attention"]


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None = None,
                     mask: torch.Tensor | None = None, *, scale: float = 1.0,
                     backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of R query rows per batch element over that element's S memory positions.

    q: [B, R, E]; keys: [B, S, E]; values: [B, S, Ev]; bias: [B, 1, S] or [B, R, S] added to the scores, or
    None; mask: [B, S] bool (False = never attended: not even read), or None. Returns (out [B, R, Ev],
    weights [B, R, S]): weights = softmax over the unmasked positions of scale · q keysᵀ + bias, exactly 0
    at the masked ones (all 0, and out 0, where none is unmasked); out = weights · values.

    The fused kernel is forward-only: it runs when no input needs a gradient (decoding under
    ``torch.no_grad()``); when autograd is recording, or an input carries a forward-mode tangent, the
    reference (differentiable) implementation runs instead. backend: "auto", "reference", "cpu" or "triton"
    (the GPU path: batched GEMMs, what "auto" runs on CUDA).
    """
    q, keys, values, bias = entry_prologue("q", q, 3, keys, values, bias)
    batch, rows, dim = q.shape
    check_tensor("keys", keys, shape=(batch, None, dim), like=q)
    check_positive("keys", keys, (1,))
    length = keys.shape[1]
    check_tensor("values", values, shape=(batch, length, None), like=q)
    check_positive("values", values, (2,))
    if bias is not None:
        check_tensor("bias", bias, ndim=3, like=q)
        if bias.shape[0] != batch or bias.shape[1] not in (1, rows) or bias.shape[2] != length:
            raise ValueError(f"bias must have shape [{batch}, 1 or {rows}, {length}], got {tuple(bias.shape)}")
    check_optional("mask", mask, shape=(batch, length), dtype=torch.bool, floating=False, like=q)
    scale = check_number("scale", scale)
    resolved = resolve_backend(backend, "decode_attention", q.device, q.dtype)
    tensors = (q, keys, values, bias)
    if resolved != "cpu" or records_grad(*tensors) or has_tangent(*tensors):
        # "triton" (the GPU path) and "reference" run the same torch ops; so do the CPU backend's
        # differentiable calls.
        return reference.decode_attention(q, keys, values, bias, mask, scale=scale)
    return kernel(resolved, _MODULE, "decode_attention")(q, keys, values, bias, mask, scale)


if cpu_available():
    @torch.library.register_fake("fastqa::decode_attention")
    def _fake(q, keys, values, bias, mask, scale):
        return q.new_empty((*q.shape[:2], values.shape[2])), q.new_empty((*q.shape[:2], keys.shape[1]))


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("decode_attention", lambda d, b: ((d.randn(b, 1, 4), d.randn(b, 5, 4), d.randn(b, 5, 3)), {}))
