"""Pure-PyTorch trilinear similarity and context-query attention (QANet / BiDAF).

The memory-efficient form is the ground truth: S = (c·w_c) + (q·w_q)ᵀ + (c∘w_cq)·qᵀ (+ bias), never
the [B, n, m, 3d] concatenation. The tutorials' naive form is kept only as a benchmark baseline.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def trilinear_similarity(c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """S[b, i, j] = w · [c_i; q_j; c_i ∘ q_j] (+ bias).

    c: [B, n, d]; q: [B, m, d]; weight: [3d] = (w_c, w_q, w_cq); bias: [1] or []. Returns [B, n, m].
    """
    w_c, w_q, w_cq = weight.chunk(3)
    s = (c @ w_c).unsqueeze(2) + (q @ w_q).unsqueeze(1) + torch.bmm(c * w_cq, q.transpose(1, 2))
    return s if bias is None else s + bias.reshape(())


def trilinear_similarity_naive(c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """The tutorials' version: builds [B, n, m, 3d]. Benchmark baseline only."""
    n, m = c.shape[1], q.shape[1]
    cc = c.unsqueeze(2).expand(-1, -1, m, -1)
    qq = q.unsqueeze(1).expand(-1, n, -1, -1)
    s = torch.cat([cc, qq, cc * qq], dim=-1) @ weight
    return s if bias is None else s + bias.reshape(())


def masked_softmax(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax over ``dim`` of the entries where ``mask`` (bool, True = real) holds; zeros elsewhere,
    and a slice with no real entry is all zeros (never NaN)."""
    p = torch.softmax(x.masked_fill(~mask, torch.finfo(x.dtype).min), dim=dim)
    return p * mask


def _attend(c: torch.Tensor, q: torch.Tensor, s: torch.Tensor, c_mask: torch.Tensor,
            q_mask: torch.Tensor) -> torch.Tensor:
    s_row = masked_softmax(s, q_mask.unsqueeze(1), dim=2)  # over the question, per context word
    s_col = masked_softmax(s, c_mask.unsqueeze(2), dim=1)  # over the context, per question word
    a = torch.bmm(s_row, q)
    b = torch.bmm(s_row, torch.bmm(s_col.transpose(1, 2), c))  # S̄(S̿ᵀC): never [B, n, n]
    return torch.cat([c, a, c * a, c * b], dim=-1)


def context_query_attention(c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor,
                            weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """QANet context-query attention.

    c: [B, n, d]; q: [B, m, d]; c_mask: [B, n] bool; q_mask: [B, m] bool (True = real token);
    weight: [3d]; bias: [1] or None. With S̄ the row softmax of S over real question words and S̿ the
    column softmax over real context words: A = S̄Q, B = S̄(S̿ᵀC). Returns [c, A, c∘A, c∘B]: [B, n, 4d].
    """
    return _attend(c, q, trilinear_similarity(c, q, weight, bias), c_mask, q_mask)


def context_query_attention_naive(c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor,
                                  weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """As ``context_query_attention`` but with the tutorials' [B, n, m, 3d] similarity. Benchmark baseline only."""
    return _attend(c, q, trilinear_similarity_naive(c, q, weight, bias), c_mask, q_mask)


class _TrilinearParameters(nn.Module):
    """The parameters of a trilinear similarity over ``d_model`` features, which both modules below hold:
    ``weight`` [3d] = (w_c, w_q, w_cq), initialised as nn.Linear(3d, 1)'s, and ``bias`` [1] (optional),
    zero."""

    def __init__(self, d_model: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(3 * d_model))
        self.bias = nn.Parameter(torch.empty(1)) if bias else None
        bound = 1.0 / math.sqrt(self.weight.numel())  # as nn.Linear(3d, 1)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class TrilinearSimilarity(_TrilinearParameters):
    """S = w·[c; q; c∘q] (+ b). Parameters: ``weight`` [3d], ``bias`` [1] (optional)."""

    def forward(self, c: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """c: [B, n, d]; q: [B, m, d] -> [B, n, m]."""
        return trilinear_similarity(c, q, self.weight, self.bias)


class ContextQueryAttention(_TrilinearParameters):
    """QANet context-query attention. Parameters: ``weight`` [3d], ``bias`` [1] (optional)."""

    def forward(self, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor) -> torch.Tensor:
        """c: [B, n, d]; q: [B, m, d]; masks [B, n], [B, m] bool -> [B, n, 4d]."""
        return context_query_attention(c, q, c_mask, q_mask, self.weight, self.bias)
