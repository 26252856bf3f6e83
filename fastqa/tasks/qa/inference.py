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
A reader without span logits is ranked by its per-window probabilities, and without the words (the ``tokens`` of
``Passage`` and ``Query``) no window is preferred.

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

__all__ = ["DEFAULT_STRIDE", "RELEVANCE_WEIGHT", "Candidate", "Passage", "Query", "ReadOptions", "Reading", "plan_windows",
           "window_settings", "inference_autocast", "lexical_terms", "paragraph_starts", "read_windows"]

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
    def answer_window(self) -> int:
        """The window that holds the answer: the null's when it wins, else the best span's."""
        return self.null_window if self.is_null else self.best.window

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


@dataclass(frozen=True)
class Passage:
    """A context to read: word ids ``words`` [n], char ids ``chars`` [n, W]; optionally its ``tokens`` (the
    windows' relevance to the question, module docstring) and its ``text`` with the tokens' character
    ``offsets`` (its paragraphs: a text longer than a window is read a paragraph per window, ``plan_windows``)."""

    words: torch.Tensor
    chars: torch.Tensor
    tokens: Sequence[str] | None = None
    text: str | None = None
    offsets: Sequence[tuple[int, int]] | None = None

    def breaks(self) -> Sequence[int]:
        """The tokens that start a paragraph (none known without the text and offsets)."""
        if self.text is None or self.offsets is None:
            return ()
        return paragraph_starts(self.text, self.offsets)


@dataclass(frozen=True)
class Query:
    """A question about ``contexts[context]``: word ids ``words`` [m], char ids ``chars`` [m, W']; optionally its
    ``tokens`` (with the context's: the windows' relevance to it)."""

    words: torch.Tensor
    chars: torch.Tensor
    context: int
    tokens: Sequence[str] | None = None


@dataclass(frozen=True)
class ReadOptions:
    """How ``read_windows`` reads.

    k: the best distinct spans kept per question; max_context: the window's length in tokens (None reads every
    context whole: training-time evaluation), ``stride`` tokens of overlap; batch_size: (question, window) rows
    per batch; word_pad, char_pad: the vocabularies' padding ids; device: where the model runs (None: its
    parameters'); autocast: bf16 autocast on a GPU (``inference_autocast``); keep_scores: keep every window's
    scores on the CPU so that ``Reading.widen`` can rank more spans later; graphs: a QANet reads each batch
    through a bucket's static buffers, replayed as a CUDA graph on a GPU (``fastqa.models.qanet.graphed``)."""

    k: int = 1
    max_answer_len: int = 30
    max_context: int | None = None
    stride: int = DEFAULT_STRIDE
    batch_size: int = 32
    word_pad: int = 0
    char_pad: int = 0
    device: torch.device | str | None = None
    autocast: bool = True
    keep_scores: bool = False
    graphs: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@torch.no_grad()
def read_windows(model: nn.Module, contexts: Sequence[Passage], questions: Sequence[Query],
                 options: ReadOptions = ReadOptions(), *, on_batch: BatchHook | None = None,
                 progress: Callable[[int], None] | None = None) -> list[Reading]:
    """Read every question against its context in windows; one ``Reading`` per question, in order.

    on_batch: called for every batch (e.g. to add up a loss); progress: called with the number of questions
    whose last window was just read. The model is put in eval mode and back.
    """
    device = torch.device(options.device) if options.device is not None else next(model.parameters()).device
    state = _Pass(model, contexts, questions, options)
    was_training = model.training
    model.eval()
    forward = GraphedReader.of(model) if options.graphs and isinstance(model, QANet) else model
    try:
        for rows in bucket_batches(state.lengths, options.batch_size, seed=0, shuffle=False):
            picked = [state.units[r] for r in rows]
            inputs = state.inputs(picked, device)
            with inference_autocast(device, options.autocast):
                s1, s2 = forward(*inputs, logits=True) if state.logits else forward(*inputs)
            s1, s2 = s1.float(), s2.float()
            if on_batch is not None:
                lp1, lp2 = (F.log_softmax(s1, dim=1), F.log_softmax(s2, dim=1)) if state.logits else (s1, s2)
                on_batch(picked, inputs, lp1, lp2)
            for _ in range(state.merge(picked, s1, s2)):
                if progress is not None:
                    progress(1)
    finally:
        model.train(was_training)
    return state.finish()


class _Pass:
    """One ``read_windows`` call: every question's windows and ``Reading``, the (question, window) rows, their
    relevance priors, the spans found so far and each document's normaliser."""

    def __init__(self, model: nn.Module, contexts: Sequence[Passage], questions: Sequence[Query],
                 options: ReadOptions) -> None:
        self.contexts, self.questions, self.options = contexts, questions, options
        self.no_answer = bool(model.config.no_answer)
        # Unnormalised scores where the reader has them (ranked across windows), else its log-probabilities.
        self.logits = bool(getattr(model, "SPAN_LOGITS", False))
        plans: dict[int, list[tuple[int, int]]] = {}
        self.readings: list[Reading] = []
        self.units: list[tuple[int, int]] = []          # (question, window index)
        for qi, q in enumerate(questions):
            c = q.context
            if c not in plans:
                plans[c] = plan_windows(len(contexts[c].words), options.max_context, options.stride,
                                        contexts[c].breaks())
            self.readings.append(Reading(plans[c], _decoding=(options.max_answer_len, self.no_answer)))
            self.units.extend((qi, wi) for wi in range(len(plans[c])))
        self.prior = self._priors(plans) if self.logits else {}
        self.left = [len(r.windows) for r in self.readings]
        self.found: list[dict[tuple[int, int], Candidate]] = [{} for _ in self.readings]
        self.lengths = [b - a for a, b in (self.readings[qi].windows[wi] for qi, wi in self.units)]
        self.log_z = [-math.inf if self.logits else 0.0] * len(self.readings)

    def _priors(self, plans: dict[int, list[tuple[int, int]]]) -> dict[tuple[int, int], float]:
        """Each (question, window)'s prior: RELEVANCE_WEIGHT x BM25, where a context has several windows and the
        words of both are known."""
        prior: dict[tuple[int, int], float] = {}
        context_terms: dict[int, list[str | None]] = {}
        for qi, q in enumerate(self.questions):
            passage = self.contexts[q.context]
            if len(plans[q.context]) < 2 or passage.tokens is None or q.tokens is None:
                continue
            if q.context not in context_terms:
                context_terms[q.context] = lexical_terms(passage.tokens)
            relevance = _window_relevance(plans[q.context], context_terms[q.context], lexical_terms(q.tokens))
            for wi, r in enumerate(relevance):
                prior[qi, wi] = RELEVANCE_WEIGHT * r
        return prior

    def inputs(self, picked: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, ...]:
        """The rows ``picked``, padded, on ``device``: context words [B, L] and chars [B, L, W], question words
        [B, M] and chars [B, M, W']."""
        word_pad, char_pad = self.options.word_pad, self.options.char_pad
        spans = [self.readings[qi].windows[wi] for qi, wi in picked]
        ctx = [self.contexts[self.questions[qi].context] for qi, _ in picked]
        qs = [self.questions[qi] for qi, _ in picked]
        inputs = (pad([c.words[a:b].tolist() for c, (a, b) in zip(ctx, spans)], word_pad),
                  pad_chars([c.chars[a:b] for c, (a, b) in zip(ctx, spans)], char_pad),
                  pad([q.words.tolist() for q in qs], word_pad),
                  pad_chars([q.chars for q in qs], char_pad))
        return tuple(t.to(device, non_blocking=True) for t in inputs)

    def merge(self, picked: list[tuple[int, int]], s1: torch.Tensor, s2: torch.Tensor) -> int:
        """Merge a batch's start and end scores s1, s2 [B, L'] (rows ``picked``) into the readings; returns how
        many questions just had their last window read."""
        options, no_answer = self.options, self.no_answer
        spans = [self.readings[qi].windows[wi] for qi, wi in picked]
        top = decode_top_spans(s1, s2, options.k, max_answer_len=options.max_answer_len, no_answer=no_answer,
                               lengths=torch.tensor([b - a for a, b in spans]))
        # Each window's normaliser: the log of the sum of exp(start + end) over its (start, end) pairs.
        window_z = (torch.logsumexp(s1, dim=1) + torch.logsumexp(s2, dim=1)).tolist() if self.logits else None
        # One copy to the host per batch, then plain Python over k entries per row.
        top = {name: top[name].tolist() for name in ("start", "end", "log_score", "valid", "log_null")}
        kept = (s1.cpu(), s2.cpu()) if options.keep_scores else None
        done = 0
        for row, (qi, wi) in enumerate(picked):
            a = spans[row][0]
            reading = self.readings[qi]
            bonus = self.prior.get((qi, wi), 0.0)
            if self.logits:
                self.log_z[qi] = float(np.logaddexp(self.log_z[qi], window_z[row] + bonus))
            null = top["log_null"][row]
            if no_answer and null + bonus < reading.log_null:
                reading.log_null, reading.null_window = null + bonus, wi
            _merge(self.found[qi], top, row, a, bonus, wi)
            if kept is not None:
                m = spans[row][1] - a + (1 if no_answer else 0)
                reading._rows.append((wi, a, kept[0][row, :m].clone(), kept[1][row, :m].clone(), bonus))
            self.left[qi] -= 1
            done += self.left[qi] == 0
        return done

    def finish(self) -> list[Reading]:
        """The readings, each with its k best spans scored over its whole document."""
        for reading, seen, z in zip(self.readings, self.found, self.log_z):
            reading.log_z = z
            _rank(reading, seen, self.options.k)
        return self.readings
