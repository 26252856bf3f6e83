"""Pure-PyTorch decode-time attention: the ground truth and fallback of ``fastqa.decode_attention``."""
from __future__ import annotations

import torch
from torch import nn


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None = None,
                     mask: torch.Tensor | None = None, *, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of R query rows per batch element over that element's S memory positions.

    q: [B, R, E]; keys: [B, S, E]; values: [B, S, Ev]; bias: [B, 1, S] or [B, R, S] added to the scores, or
    None; mask: [B, S] bool (False = a position never attended), or None. Returns (out [B, R, Ev], weights
    [B, R, S]): weights = softmax over the unmasked positions of scale · q keysᵀ + bias, exactly 0 at the
    masked ones (all 0, and out 0, where no position is unmasked); out = weights · values.
    """
    scores = torch.bmm(q, keys.transpose(1, 2)).mul_(scale) if bias is None else \
        torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)
    if mask is not None:
        scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(1).view(-1, 1, 1), 0.0)   # no position: 0, not NaN
    return torch.bmm(weights, values), weights


class DecodeAttention(nn.Module):
    """``decode_attention`` as a module (no parameters), for models built from interchangeable layers."""

    def forward(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """See ``decode_attention``: (out [B, R, Ev], weights [B, R, S])."""
        return decode_attention(q, keys, values, bias, mask, scale=scale)
