"""Pure-PyTorch multi-head self-attention over padded sequences (torch's fused SDPA): the ground truth and
fallback of ``fastqa.self_attention``, and the pre-LayerNorm sublayer branch QANet's encoder blocks use."""
from __future__ import annotations

import numbers
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def check_segments(segments: Sequence[int] | None, length: int) -> list[int] | None:
    """segments as a list of ints: positive lengths summing to ``length`` (or None). Not a sequence (an int,
    a string, a tensor): a TypeError naming ``segments``; lengths that are not positive ints or do not sum
    to ``length``: a ValueError naming it."""
    if segments is None:
        return None
    if isinstance(segments, (str, bytes, torch.Tensor)) or not isinstance(segments, Sequence):
        raise TypeError(f"segments must be a sequence of int lengths summing to L = {length} (or None), "
                        f"got {type(segments).__name__}")
    segments = list(segments)
    if (not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n > 0 for n in segments)
            or sum(segments) != length):
        raise ValueError(f"segments must be positive int lengths summing to L = {length}, got {segments}")
    return [int(n) for n in segments]


def self_attention(qkv: torch.Tensor, mask: torch.Tensor, heads: int,
                   segments: Sequence[int] | None = None) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D) + mask) v per head, heads side by side.

    qkv: [B, L, 3C], the output of one nn.Linear(C, 3C): q = qkv[..., :C], k = qkv[..., C:2C],
    v = qkv[..., 2C:], head h in channels [h*D, (h+1)*D) of each, D = C / heads.
    mask: [B, L] bool, True = a real position: the keys to attend to; the padded query rows give zeros, so a
    sequence with no real position gives zeros throughout (never NaN) and passes no gradient. segments:
    lengths summing to L that cut every row into sequences attended apart (None: each row is one).
    Returns [B, L, C].
    """
    segments = check_segments(segments, qkv.shape[1])
    if segments is not None:
        # split: views, whose backward is one cat (slicing would zero-fill a full-size gradient per piece)
        pieces = zip(qkv.split(segments, dim=1), mask.split(segments, dim=1))
        return torch.cat([self_attention(q, m, heads) for q, m in pieces], dim=1)
    b, length, c3 = qkv.shape
    c = c3 // 3
    # split (not select) q, k, v: its backward is one cat, where select's zero-fills [3, B, h, L, D].
    q, k, v = qkv.view(b, length, 3 * heads, c // heads).transpose(1, 2).split(heads, dim=1)   # [B, h, L, D]
    # A sequence without a real position would give NaN rows (a softmax over no key): it attends to all of
    # its positions instead, and its rows, all padding, are zeroed below with the others.
    keys = mask | ~mask.any(dim=1, keepdim=True)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=keys[:, None, None, :])
    return o.transpose(1, 2).reshape(b, length, c).masked_fill(~mask.unsqueeze(-1), 0.0)


class SelfAttention(nn.Module):
    """Pre-LN multi-head self-attention sublayer branch: out(attention(qkv(LN(x)))).

    Parameters: ``norm`` (nn.LayerNorm(d_model)), ``qkv`` (nn.Linear(d_model, 3 d_model): the three
    projections as one GEMM), ``out`` (nn.Linear(d_model, d_model)); ``fastqa.layers.SelfAttention`` has
    the same, so one state_dict loads into both.
    """

    projection: type[nn.Linear] = nn.Linear   # the class of qkv and out (the fast layer: fastqa.layers.Linear)

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if heads <= 0 or d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be a positive multiple of heads ({heads})")
        self.heads = heads
        self.norm = nn.LayerNorm(d_model)
        self.qkv = self.projection(d_model, 3 * d_model)
        self.out = self.projection(d_model, d_model)

    def extra_repr(self) -> str:
        return f"heads={self.heads}"

    def attend(self, qkv: torch.Tensor, mask: torch.Tensor, segments: Sequence[int] | None) -> torch.Tensor:
        return self_attention(qkv, mask, self.heads, segments)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, segments: Sequence[int] | None = None) -> torch.Tensor:
        """x: [B, L, d]; mask: [B, L] bool (True = a real position) -> [B, L, d].

        segments: lengths summing to L that cut each row into sequences attended separately (a packed batch:
        several sequences one after another in one row, without their padding); None: each row is one."""
        return self.out(self.attend(self.qkv(self.norm(x)), mask, segments))
