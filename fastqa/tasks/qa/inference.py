"""Reading contexts of any length: overlapping windows of context tokens, batched, best spans merged.

A reader sees at most ``max_context`` context tokens at a time (its self-attention is quadratic in the
length and it was trained on contexts cut to ``Limits.context`` tokens). A longer context is read a paragraph
per window where it has paragraphs (blank lines), as the readers were trained; a longer paragraph, or a text
without paragraphs, is cut into windows of ``max_context`` tokens that overlap by at least ``stride`` tokens
(an answer near one window's edge lies well inside the next), the last one ending at its end; every (question, window) pair is
one row of a length-bucketed batch, so memory is bounded by ``batch_size × max_context`` whatever the
text's length. Each window's k best spans (``decode_top_spans``) are mapped back to the context's token
indices and merged: a span seen in several windows keeps its best score, and the k best distinct spans over
all windows are returned. A caller that needs more (``QAModel.answer(top_k=K)`` wants K answers that do not
overlap, and the k best spans may all overlap the first) reads with ``keep_scores`` and grows the pool with
``Reading.widen`` until it has them or the text has no more spans: the windows' scores are kept, not read again.

Spans are ranked across windows by an unnormalised score that compares between windows: start logit + end logit
(``forward(..., logits=True)`` of a reader whose ``SPAN_LOGITS`` is true) plus ``RELEVANCE_WEIGHT`` times the
window's BM25 relevance to the question, computed over the document's windows from the words of both
(``lexical_terms``; the retrieval score of open-domain readers, which knows that a rare question word such as a
name occurs in this window and no other). Not by probabilities within their window: each window's softmax is its
own, so every window proposes some confident span, and the more windows a document has, the likelier a wrong one
would win. A span's reported score is exp(its score) over the sum of that over every (start, end) pair of every
window: a softmax over the whole document, which for a context read in one window is p_start·p_end as before.
A reader without span logits is ranked by its per-window probabilities, and without the words (``terms``) no
window is preferred.

No-answer (SQuAD v2.0) readers: every window gives a null score; the context's is the smallest over its
windows (the window most sure the answer is there decides), and the null wins when it beats the best span.
A context that fits one window is read whole, exactly as before windows existed.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..._checks import check_int
from ...data.batching import bucket_batches, pad
from ...errors import UserError
from ...models.qanet import QANet
from ...models.qanet.graphed import GraphedReader
from .spans import decode_top_spans
from .encoding import pad_chars

__all__ = ["DEFAULT_STRIDE", "RELEVANCE_WEIGHT", "Candidate", "Reading", "plan_windows", "window_settings",
           "inference_autocast", "lexical_terms", "paragraph_starts", "read_windows"]

#: default overlap of consecutive windows, in tokens (the doc stride of the usual QA pipelines)
DEFAULT_STRIDE = 128
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")
#: logits per unit of BM25 relevance of a window to the question (module docstring): chosen on SQuAD v1.1 dev
#: articles 30-34, a plateau from 1 to 4 there (the held-out articles 40-47 were not looked at)
RELEVANCE_WEIGHT = 2.0
# BM25's term-frequency saturation and length normalisation, the usual values
_BM25_K1, _BM25_B = 1.2, 0.75
# Function words carry no relevance (English: the readers are SQuAD's)
_STOPWORDS = frozenset(
    "a an the of in on at to for by with from and or but is was were are be been being as that this these those "
    "it its which who whom whose what when where why how did does do done than then there their they he she his "
    "her him i you we our your not no into onto about after before over under".split())


def inference_autocast(device: torch.device, enabled: bool = True):
    """Autocast for evaluation and prediction: bf16 on a GPU, as the recipe trains there; fp32 on the CPU (a
    reader loaded with a precision computes in its weights' dtype: ``enabled`` False)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


def window_settings(max_context: int | None, stride: int | None, default_context: int) -> tuple[int, int]:
    """(max_context, stride) with their defaults: the model's context length, and ``DEFAULT_STRIDE`` (at most
    half a window, so a short ``max_context`` still advances). A stride that leaves no progress is an error."""
    if max_context is None:
        max_context = default_context
    max_context = check_int("max_context", max_context, low=1, error=UserError)
    if stride is not None:
        stride = check_int("stride", stride, low=0, error=UserError)
    if stride is None:
        stride = min(DEFAULT_STRIDE, max_context // 2)
    if stride >= max_context:
        raise UserError(f"stride {stride} must be smaller than max_context {max_context} (the overlap of two "
                        "windows cannot be a whole window)")
    return max_context, stride


def plan_windows(n: int, max_context: int | None, stride: int, breaks: Sequence[int] = ()
                 ) -> list[tuple[int, int]]:
    """Token ranges [a, b) covering n tokens: one when n <= max_context (or max_context is None), else
    windows of max_context tokens starting every max_context - stride tokens, the last ending at n.

    ``breaks``: the tokens that start a paragraph (``paragraph_starts``). A text longer than a window is then
    read a paragraph per window -- what the readers were trained on -- and only a paragraph longer than a
    window is cut as above."""
    if max_context is None or n <= max_context:
        return [(0, n)]
    edges = [0, *sorted(b for b in set(breaks) if 0 < b < n), n]
    if len(edges) > 2:
        return [(a + x, a + y) for a, b in zip(edges, edges[1:]) for x, y in plan_windows(b - a, max_context, stride)]
    step = max_context - stride
    starts = list(range(0, n - max_context, step)) + [n - max_context]
    return [(a, a + max_context) for a in starts]


def paragraph_starts(text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """The tokens of ``text`` (character spans ``offsets``) that begin a paragraph: those after a blank line."""
    return [i for i in range(1, len(offsets)) if _BLANK_LINE.search(text, offsets[i - 1][1], offsets[i][0])]


@dataclass
class Candidate:
    """A span of context tokens [start, end] (inclusive): ``log_score`` its start + end logit (comparable between
    windows; the log-probabilities for a reader without logits), ``score`` its probability over the whole
    document (module docstring)."""

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
    log_null: float = math.inf    # smallest null score over the windows (no-answer readers; +inf otherwise)
    null_window: int = 0
    log_z: float = 0.0            # log of the document's normaliser: every score's denominator (module docstring)
    asked: int = 0                # the k the candidates were cut to (fewer of them: the text has no more spans)
    # (window index, its first token, start scores [m], end scores [m], its relevance bonus) per window, on the
    # CPU: what ``widen`` re-ranks (``read_windows(keep_scores=True)``; empty otherwise). m: the window's length,
    # plus the null position of a no-answer reader.
    _rows: list[tuple[int, int, torch.Tensor, torch.Tensor, float]] = field(default_factory=list, repr=False)
    _decoding: tuple[int, bool] = field(default=(30, False), repr=False)   # (max_answer_len, no_answer)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def is_null(self) -> bool:
        return self.log_null > self.best.log_score if math.isfinite(self.log_null) else False

    @property
    def null_score(self) -> float:
        """The no-answer option's probability on the scale of the spans' scores (no-answer readers)."""
        return math.exp(self.log_null - self.log_z)

    @property
    def na_prob(self) -> float:
        """null / (null + best span), in the log domain (0 for a reader without a no-answer option)."""
        if not math.isfinite(self.log_null):
            return 0.0
        return float(torch.sigmoid(torch.tensor(self.log_null - self.best.log_score)))

    @property
    def can_widen(self) -> bool:
        """The window scores were kept and the text may hold spans beyond the candidates (``widen``)."""
        return bool(self._rows) and len(self.candidates) >= self.asked

    def widen(self, k: int) -> None:
        """Make ``candidates`` the k best distinct spans over all windows, from the kept window scores (no model
        call), ranked as ``read_windows`` ranks them: a smaller k's scores stay first (among spans of equal score
        at its cut, which ones a smaller k kept is ``topk``'s choice)."""
        if not self._rows:
            raise RuntimeError("widen needs the window scores: read_windows(..., keep_scores=True)")
        k = check_int("k", k, low=1)
        max_answer_len, no_answer = self._decoding
        # One decode over the kept windows, padded to the longest ([W, m]); ``lengths`` masks the padding.
        extra = 1 if no_answer else 0
        s1 = nn.utils.rnn.pad_sequence([r[2] for r in self._rows], batch_first=True)
        s2 = nn.utils.rnn.pad_sequence([r[3] for r in self._rows], batch_first=True)
        top = decode_top_spans(s1, s2, k, max_answer_len=max_answer_len, no_answer=no_answer,
                               lengths=torch.tensor([len(r[2]) - extra for r in self._rows]))
        top = {name: top[name].tolist() for name in ("start", "end", "log_score", "valid")}
        seen: dict[tuple[int, int], Candidate] = {}
        for row, (wi, first, _, _, bonus) in enumerate(self._rows):
            _merge(seen, top, row, first, bonus, wi)
        _rank(self, seen, k)


def _merge(seen: dict[tuple[int, int], Candidate], top: dict[str, Any], row: int, first: int, bonus: float,
           window: int) -> None:
    """Add row ``row`` of ``decode_top_spans``'s output (a window starting at token ``first``) to ``seen``: a span
    seen in several windows keeps its best score. ``top``'s tensors are lists here (one host copy per batch)."""
    for s, e, ls, ok in zip(top["start"][row], top["end"][row], top["log_score"][row], top["valid"][row]):
        if not ok:
            break
        ls += bonus
        key = (first + s, first + e)
        if key not in seen or ls > seen[key].log_score:
            seen[key] = Candidate(first + s, first + e, 0.0, ls, window)   # its score: once every window is in


def _rank(reading: Reading, seen: dict[tuple[int, int], Candidate], k: int) -> None:
    """``reading.candidates``: the k best of ``seen``, best first, each scored over the whole document."""
    # Among equal scores the earlier span, so the order does not depend on the batching.
    reading.candidates = sorted(seen.values(), key=lambda c: (-c.log_score, c.start, c.end))[:k]
    reading.asked = k
    for c in reading.candidates:
        c.score = math.exp(c.log_score - reading.log_z)
    if not reading.candidates:
        raise RuntimeError("a window produced no span")  # n >= 1 always has the span (0, 0)


def lexical_terms(tokens: Sequence[str]) -> list[str | None]:
    """The term each token counts as for relevance: its lowercased letters and digits, None for punctuation
    and function words."""
    out: list[str | None] = []
    for t in tokens:
        term = "".join(ch for ch in t.lower() if ch.isalnum())
        out.append(term if term and term not in _STOPWORDS else None)
    return out


def _window_relevance(windows: list[tuple[int, int]], context_terms: Sequence[str | None],
                      question_terms: Sequence[str | None]) -> list[float]:
    """BM25 of the question against each window [a, b) of one document, the windows being the collection."""
    counts = [Counter(t for t in context_terms[a:b] if t is not None) for a, b in windows]
    lengths = [sum(c.values()) for c in counts]
    mean = max(sum(lengths) / len(lengths), 1e-9)
    n = len(windows)
    df = Counter(t for c in counts for t in c)
    query = [t for t in question_terms if t is not None]
    out = []
    for c, length in zip(counts, lengths):
        total = 0.0
        for t in query:
            tf = c.get(t, 0)
            if tf:
                idf = math.log((n - df[t] + 0.5) / (df[t] + 0.5) + 1.0)
                total += idf * tf * (_BM25_K1 + 1) / (tf + _BM25_K1 * (1 - _BM25_B + _BM25_B * length / mean))
        out.append(total)
    return out


#: called with each batch: its rows' (question index, window index), the padded model inputs, log_p1, log_p2
BatchHook = Callable[[list[tuple[int, int]], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor], None]


@torch.no_grad()
def read_windows(model: nn.Module, contexts: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 questions: Sequence[tuple[torch.Tensor, torch.Tensor, int]], *, k: int = 1,
                 max_answer_len: int = 30, max_context: int | None = None, stride: int = DEFAULT_STRIDE,
                 batch_size: int = 32, word_pad: int = 0, char_pad: int = 0,
                 device: torch.device | str | None = None, autocast: bool = True, on_batch: BatchHook | None = None,
                 progress: Callable[[int], None] | None = None,
                 terms: tuple[Sequence[Sequence[str | None]], Sequence[Sequence[str | None]]] | None = None,
                 breaks: Sequence[Sequence[int]] | None = None, keep_scores: bool = False,
                 graphs: bool = False) -> list[Reading]:
    """Read every question against its context in windows; one ``Reading`` per question, in order.

    contexts: (word ids [n], char ids [n, W]) per context; questions: (word ids [m], char ids [m, W'],
    context index) per question. max_context None reads every context whole (training-time evaluation).
    on_batch: called for every batch (e.g. to add up a loss); progress: called with the number of
    questions whose last window was just read; autocast: bf16 autocast on a GPU (``inference_autocast``); terms: (per context, per question) the ``lexical_terms`` of
    their tokens, for the windows' relevance to the question (module docstring); breaks: per context the tokens
    that start a paragraph (``plan_windows``); keep_scores: keep every window's scores on the CPU so that
    ``Reading.widen`` can rank more spans later; graphs: a QANet reads each batch through a bucket's static
    buffers, replayed as a CUDA graph on a GPU (``fastqa.models.qanet.graphed``). The model is put in eval mode
    and back.
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
            plans[c] = plan_windows(len(contexts[c][0]), max_context, stride, breaks[c] if breaks else ())
        readings.append(Reading(plans[c], _decoding=(max_answer_len, no_answer)))
        units.extend((qi, wi) for wi in range(len(plans[c])))
    # Each (question, window)'s prior: RELEVANCE_WEIGHT x BM25, for readers ranked by logits, where there are
    # several windows and the words are known.
    prior: dict[tuple[int, int], float] = {}
    logits = bool(getattr(model, "SPAN_LOGITS", False))
    if logits and terms is not None:
        context_terms, question_terms = terms
        for qi, (_, _, c) in enumerate(questions):
            if len(plans[c]) > 1:
                for wi, r in enumerate(_window_relevance(plans[c], context_terms[c], question_terms[qi])):
                    prior[qi, wi] = RELEVANCE_WEIGHT * r
    left = [len(r.windows) for r in readings]
    found: list[dict[tuple[int, int], Candidate]] = [{} for _ in readings]
    lengths = [readings[qi].windows[wi][1] - readings[qi].windows[wi][0] for qi, wi in units]
    # Unnormalised scores where the reader has them (ranked across windows), else its log-probabilities.
    log_z = [-math.inf if logits else 0.0] * len(readings)
    was_training = model.training
    model.eval()
    forward = GraphedReader.of(model) if graphs and isinstance(model, QANet) else model
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
            with inference_autocast(device, autocast):
                s1, s2 = forward(*inputs, logits=True) if logits else forward(*inputs)
            s1, s2 = s1.float(), s2.float()
            lp1, lp2 = (F.log_softmax(s1, dim=1), F.log_softmax(s2, dim=1)) if logits else (s1, s2)
            if on_batch is not None:
                on_batch(picked, inputs, lp1, lp2)
            top = decode_top_spans(s1, s2, k, max_answer_len=max_answer_len, no_answer=no_answer,
                                   lengths=torch.tensor([b - a for a, b in spans]))
            # Each window's normaliser: the log of the sum of exp(start + end) over its (start, end) pairs.
            window_z = (torch.logsumexp(s1, dim=1) + torch.logsumexp(s2, dim=1)).tolist() if logits else None
            # One copy to the host per batch, then plain Python over k entries per row.
            top = {name: top[name].tolist() for name in ("start", "end", "log_score", "valid", "log_null")}
            kept = (s1.cpu(), s2.cpu()) if keep_scores else None
            for row, (qi, wi) in enumerate(picked):
                a = spans[row][0]
                reading = readings[qi]
                bonus = prior.get((qi, wi), 0.0)
                if logits:
                    log_z[qi] = float(np.logaddexp(log_z[qi], window_z[row] + bonus))
                null = top["log_null"][row]
                if no_answer and null + bonus < reading.log_null:
                    reading.log_null, reading.null_window = null + bonus, wi
                _merge(found[qi], top, row, a, bonus, wi)
                if kept is not None:
                    m = spans[row][1] - a + (1 if no_answer else 0)
                    reading._rows.append((wi, a, kept[0][row, :m].clone(), kept[1][row, :m].clone(), bonus))
                left[qi] -= 1
                if progress is not None and left[qi] == 0:
                    progress(1)
    finally:
        model.train(was_training)
    for reading, seen, z in zip(readings, found, log_z):
        reading.log_z = z
        _rank(reading, seen, k)
    return readings
