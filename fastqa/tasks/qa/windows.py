"""Reading contexts of any length: overlapping windows of context tokens, batched, best spans merged.

A reader sees at most ``max_context`` context tokens at a time (its self-attention is quadratic in the
length and it was trained on contexts cut to ``Limits.context`` tokens). A longer context is cut into
windows of ``max_context`` tokens that overlap by at least ``stride`` tokens (an answer near one window's
edge lies well inside the next), the last one ending at the context's end; every (question, window) pair is
one row of a length-bucketed batch, so memory is bounded by ``batch_size × max_context`` whatever the
text's length. Each window's k best spans (``decode_top_spans``) are mapped back to the context's token
indices and merged: a span seen in several windows keeps its best score, and the k best distinct spans over
all windows are returned. Scores are p_start·p_end within the window that proposed the span: the softmax of
each window is its own, as in the sliding-window readers users know.

No-answer (SQuAD v2.0) readers: every window gives a null score; the context's is the smallest over its
windows (the window most sure the answer is there decides), and the null wins when it beats the best span.
A context that fits one window is read whole, exactly as before windows existed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from ...data.batching import bucket_batches, pad
from ...errors import UserError
from .decode import decode_top_spans
from .squad import pad_chars

__all__ = ["DEFAULT_STRIDE", "Candidate", "Reading", "plan_windows", "window_settings", "inference_autocast",
           "read_windows"]

#: default overlap of consecutive windows, in tokens (the doc stride of the usual QA pipelines)
DEFAULT_STRIDE = 128


def inference_autocast(device: torch.device):
    """Autocast for evaluation and prediction: bf16 on a GPU, as the recipe trains there; fp32 on the CPU."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def window_settings(max_context: int | None, stride: int | None, default_context: int) -> tuple[int, int]:
    """(max_context, stride) with their defaults: the model's context length, and ``DEFAULT_STRIDE`` (at most
    half a window, so a short ``max_context`` still advances). A stride that leaves no progress is an error."""
    if max_context is None:
        max_context = default_context
    for name, value, least in (("max_context", max_context, 1), ("stride", stride, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise UserError(f"{name} must be an int >= {least}, got {value!r}")
    if stride is None:
        stride = min(DEFAULT_STRIDE, max_context // 2)
    if stride >= max_context:
        raise UserError(f"stride {stride} must be smaller than max_context {max_context} (the overlap of two "
                        "windows cannot be a whole window)")
    return max_context, stride


def plan_windows(n: int, max_context: int | None, stride: int) -> list[tuple[int, int]]:
    """Token ranges [a, b) covering n tokens: one when n <= max_context (or max_context is None), else
    windows of max_context tokens starting every max_context - stride tokens, the last ending at n."""
    if max_context is None or n <= max_context:
        return [(0, n)]
    step = max_context - stride
    starts = list(range(0, n - max_context, step)) + [n - max_context]
    return [(a, a + max_context) for a in starts]


@dataclass
class Candidate:
    """A span of context tokens [start, end] (inclusive) with its score p_start·p_end."""

    start: int
    end: int
    score: float
    log_score: float
    window: int                   # index into Reading.windows of the window that scored it best


@dataclass
class Reading:
    """What the reader found for one question: the k best distinct spans over all windows, best first."""

    windows: list[tuple[int, int]]
    candidates: list[Candidate] = field(default_factory=list)
    log_null: float = math.inf    # smallest log p_null over the windows (no-answer readers; +inf otherwise)
    null_window: int = 0

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def is_null(self) -> bool:
        return self.log_null > self.best.log_score if math.isfinite(self.log_null) else False

    @property
    def na_prob(self) -> float:
        """null / (null + best span), in the log domain (0 for a reader without a no-answer option)."""
        if not math.isfinite(self.log_null):
            return 0.0
        return float(torch.sigmoid(torch.tensor(self.log_null - self.best.log_score)))


#: called with the rows of each batch: (question indices, the padded model inputs, log_p1, log_p2)
BatchHook = Callable[[list[int], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor], None]


@torch.no_grad()
def read_windows(model: nn.Module, contexts: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 questions: Sequence[tuple[torch.Tensor, torch.Tensor, int]], *, k: int = 1,
                 max_answer_len: int = 30, max_context: int | None = None, stride: int = DEFAULT_STRIDE,
                 batch_size: int = 32, word_pad: int = 0, char_pad: int = 0,
                 device: torch.device | str | None = None, on_batch: BatchHook | None = None,
                 progress: Callable[[int], None] | None = None) -> list[Reading]:
    """Read every question against its context in windows; one ``Reading`` per question, in order.

    contexts: (word ids [n], char ids [n, W]) per context; questions: (word ids [m], char ids [m, W'],
    context index) per question. max_context None reads every context whole (training-time evaluation).
    on_batch: called for every batch (e.g. to add up a loss); progress: called with the number of
    questions whose last window was just read. The model is put in eval mode and back.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    no_answer = bool(model.config.no_answer)
    plans: dict[int, list[tuple[int, int]]] = {}
    readings: list[Reading] = []
    units: list[tuple[int, int]] = []          # (question, window index)
    for qi, (_, _, c) in enumerate(questions):
        if c not in plans:
            plans[c] = plan_windows(len(contexts[c][0]), max_context, stride)
        readings.append(Reading(plans[c]))
        units.extend((qi, wi) for wi in range(len(plans[c])))
    left = [len(r.windows) for r in readings]
    found: list[dict[tuple[int, int], Candidate]] = [{} for _ in readings]
    lengths = [readings[qi].windows[wi][1] - readings[qi].windows[wi][0] for qi, wi in units]
    was_training = model.training
    model.eval()
    try:
        for rows in bucket_batches(lengths, batch_size, seed=0, shuffle=False):
            picked = [units[r] for r in rows]
            spans = [readings[qi].windows[wi] for qi, wi in picked]
            ctx = [contexts[questions[qi][2]] for qi, _ in picked]
            inputs = (pad([c[0][a:b].tolist() for c, (a, b) in zip(ctx, spans)], word_pad),
                      pad_chars([c[1][a:b] for c, (a, b) in zip(ctx, spans)], char_pad),
                      pad([questions[qi][0].tolist() for qi, _ in picked], word_pad),
                      pad_chars([questions[qi][1] for qi, _ in picked], char_pad))
            inputs = tuple(t.to(device, non_blocking=True) for t in inputs)
            with inference_autocast(device):
                lp1, lp2 = model(*inputs)
            lp1, lp2 = lp1.float(), lp2.float()
            if on_batch is not None:
                on_batch([qi for qi, _ in picked], inputs, lp1, lp2)
            top = decode_top_spans(lp1, lp2, k, max_answer_len=max_answer_len, no_answer=no_answer,
                                   lengths=torch.tensor([b - a for a, b in spans]))
            # One copy to the host per batch, then plain Python over k entries per row.
            starts, ends = top["start"].tolist(), top["end"].tolist()
            log_scores, valid = top["log_score"].tolist(), top["valid"].tolist()
            log_null = top["log_null"].tolist()
            for row, (qi, wi) in enumerate(picked):
                a = spans[row][0]
                reading, seen = readings[qi], found[qi]
                if no_answer and log_null[row] < reading.log_null:
                    reading.log_null, reading.null_window = log_null[row], wi
                for s, e, ls, ok in zip(starts[row], ends[row], log_scores[row], valid[row]):
                    if not ok:
                        break
                    key = (a + s, a + e)
                    if key not in seen or ls > seen[key].log_score:
                        seen[key] = Candidate(a + s, a + e, math.exp(ls), ls, wi)
                left[qi] -= 1
                if progress is not None and left[qi] == 0:
                    progress(1)
    finally:
        model.train(was_training)
    for reading, seen in zip(readings, found):
        # Best first; among equal scores the earlier span, so the order does not depend on the batching.
        reading.candidates = sorted(seen.values(), key=lambda c: (-c.log_score, c.start, c.end))[:k]
        if not reading.candidates:
            raise RuntimeError("a window produced no span")  # n >= 1 always has the span (0, 0)
    return readings
