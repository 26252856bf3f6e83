"""Drop-in decode-time attention module running the fused kernel when nothing needs a gradient."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.decode_attention import decode_attention

__all__ = ["DecodeAttention"]


class DecodeAttention(nn.Module):
    """``fastqa.reference.DecodeAttention`` (no parameters) computed by ``fastqa.decode_attention``: one pass
    per batch element over the keys and values of its unmasked positions. ``backend``: "auto", "reference",
    "cpu" or "triton" (the GPU path)."""

    def __init__(self, backend: str = "auto") -> None:
        super().__init__()
        self.backend = backend

    def forward(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, R, E], keys [B, S, E], values [B, S, Ev] -> (out [B, R, Ev], weights [B, R, S])."""
        return decode_attention(q, keys, values, bias, mask, scale=scale, backend=self.backend)
