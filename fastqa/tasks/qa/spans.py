"""Span decoding, the one decoder (the reader's inference uses it, ``fastqa.tasks.qa.inference``): the k best
distinct spans by p1(i)·p2(j) over i <= j <= i + max_answer_len, for a whole batch at once (k = 1: the argmax).

With a no-answer option (SQuAD v2.0) the null score p1(0)·p2(0) is returned beside the spans; the reader's
inference weighs it against the best span over all of a context's windows.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..._checks import check_int

__all__ = ["decode_top_spans"]


def _check(log_p1: torch.Tensor, log_p2: torch.Tensor, max_answer_len: int) -> int:
    """The checked ``max_answer_len``; the log-probabilities' shapes checked."""
    max_answer_len = check_int("max_answer_len", max_answer_len, low=0)
    if log_p1.dim() != 2 or log_p1.shape != log_p2.shape:
        raise ValueError(f"log_p1 and log_p2 must both be [B, n], got {tuple(log_p1.shape)} and {tuple(log_p2.shape)}")
    return max_answer_len


def decode_top_spans(log_p1: torch.Tensor, log_p2: torch.Tensor, k: int, *, max_answer_len: int = 30,
                     no_answer: bool = False, lengths: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The ``k`` best spans of every row, best first: the k largest p1(i)·p2(j) over i ≤ j ≤ i + max_answer_len.

    log_p1, log_p2: [B, n] log-probabilities ([B, 1 + n] when ``no_answer``: index 0 is "no answer");
    lengths: [B] real context positions of each row (padding beyond them is never a candidate; default n).
    Returns ``start``, ``end`` [B, k] (context token indices, inclusive), ``score`` [B, k] (p1·p2; 0 where a
    row has fewer than k spans, with ``valid`` [B, k] False there), ``log_score`` [B, k] (its log, -inf
    there), and ``null``/``log_null`` [B] (p1(0)·p2(0) and its log: the no-answer score; 0 and -inf
    without a no-answer option). The spans are distinct by construction:
    each (i, j) is one entry of the band. A ``max_answer_len`` of n - 1 or more already allows every span of an
    n-token context, so it is capped there: the band is [B, n, min(max_answer_len, n - 1) + 1] whatever is asked.

    One ``topk`` over the [B, n·width] band of every row: no loop over positions or rows.
    """
    max_answer_len = _check(log_p1, log_p2, max_answer_len)
    k = check_int("k", k, low=1)
    lp1, lp2 = log_p1.float(), log_p2.float()
    B = lp1.shape[0]
    if no_answer:
        log_null = lp1[:, 0] + lp2[:, 0]
        lp1, lp2 = lp1[:, 1:], lp2[:, 1:]
    else:
        log_null = torch.full((B,), -math.inf, device=lp1.device)
    n = lp1.shape[1]
    if n == 0:
        raise ValueError("log_p1 has no context positions to decode a span from")
    width = min(max_answer_len, n - 1) + 1
    band = F.pad(lp2, (0, width - 1), value=-math.inf).unfold(1, width, 1)  # [B, n, width]: log p2(i + k)
    scores = lp1.unsqueeze(2) + band
    if lengths is not None:
        # An end past the row's last real token is no candidate (a start past it neither, as its ends are).
        ends = torch.arange(n, device=lp1.device)[:, None] + torch.arange(width, device=lp1.device)
        scores = scores.masked_fill(ends[None] >= lengths.to(lp1.device)[:, None, None], -math.inf)
    top, flat = scores.reshape(B, n * width).topk(min(k, n * width), dim=1)
    start = torch.div(flat, width, rounding_mode="floor")
    end = start + flat % width
    valid = torch.isfinite(top)
    if top.shape[1] < k:  # fewer band entries than k: pad with invalid ones so every row has k
        fill = k - top.shape[1]
        start = F.pad(start, (0, fill))
        end = F.pad(end, (0, fill))
        top = F.pad(top, (0, fill), value=-math.inf)
        valid = F.pad(valid, (0, fill), value=False)
    return {"start": start, "end": end, "score": top.exp(), "log_score": top, "valid": valid,
            "null": log_null.exp(), "log_null": log_null}
