"""Drop-in pre-LN self-attention sublayer running the fused attention kernel."""
from __future__ import annotations

from typing import Sequence

import torch

from ..ops.self_attention import self_attention
from ..reference.self_attention import SelfAttention as _ReferenceSelfAttention
from .linear import Linear

__all__ = ["SelfAttention"]


class SelfAttention(_ReferenceSelfAttention):
    """``fastqa.reference.SelfAttention`` (same parameters and state_dict) with ``fastqa.self_attention``
    between the projections: qkv's output is read as it is and the heads come out side by side, so no
    transposes either way; the projections are ``fastqa.layers.Linear`` (each product on the GEMM engine
    measured fastest for its shape). ``backend``: "auto", "reference", "cpu" or "triton" (the attention's;
    the projections pick theirs)."""

    projection = Linear

    def __init__(self, d_model: int, heads: int, backend: str = "auto") -> None:
        super().__init__(d_model, heads)
        self.backend = backend

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"

    def attend(self, qkv: torch.Tensor, mask: torch.Tensor, segments: Sequence[int] | None) -> torch.Tensor:
        return self_attention(qkv, mask, self.heads, segments=segments, backend=self.backend)
