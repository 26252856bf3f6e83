"""Drop-in modules for the trilinear similarity and QANet context-query attention.

Subclasses of the reference modules: same parameters, same state_dict (weights load both ways),
forward runs the fused op on the chosen backend.
"""
from __future__ import annotations

import torch

from .. import reference
from ..ops.context_query_attention import context_query_attention, trilinear_similarity

__all__ = ["ContextQueryAttention", "TrilinearSimilarity"]


def _extra_repr(module: torch.nn.Module) -> str:
    return f"d_model={module.weight.numel() // 3}, bias={module.bias is not None}, backend={module.backend!r}"


class TrilinearSimilarity(reference.TrilinearSimilarity):
    """S = w·[c; q; c∘q] (+ b), fused. Parameters: ``weight`` [3d], ``bias`` [1] (optional)."""

    def __init__(self, d_model: int, bias: bool = True, *, backend: str = "auto") -> None:
        super().__init__(d_model, bias)
        self.backend = backend

    def forward(self, c: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """c: [B, n, d]; q: [B, m, d] -> [B, n, m]."""
        return trilinear_similarity(c, q, self.weight, self.bias, backend=self.backend)

    def extra_repr(self) -> str:
        return _extra_repr(self)


class ContextQueryAttention(reference.ContextQueryAttention):
    """QANet context-query attention, fused. Parameters: ``weight`` [3d], ``bias`` [1] (optional)."""

    def __init__(self, d_model: int, bias: bool = True, *, backend: str = "auto") -> None:
        super().__init__(d_model, bias)
        self.backend = backend

    def forward(self, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor) -> torch.Tensor:
        """c: [B, n, d]; q: [B, m, d]; masks [B, n], [B, m] bool (True = real) -> [B, n, 4d]."""
        return context_query_attention(c, q, c_mask, q_mask, self.weight, self.bias, backend=self.backend)

    def extra_repr(self) -> str:
        return _extra_repr(self)
