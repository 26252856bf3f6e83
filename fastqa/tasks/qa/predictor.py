"""``QAModel``: a trained reader with its vocabularies, answering questions about a text.

Python use::

    qa = QAModel.load()                       # the shipped reader; or a run folder, an export, a name
    qa.answer("The Broncos won Super Bowl 50.", "Who won Super Bowl 50?")
    # Answer(text='The Broncos', start=0, end=11, score=0.71, no_answer_prob=None, abstained=False)
    qa.answer(long_text, "Who won?", top_k=3)  # [3 Answers, best first]
    qa.answer(text, "Who won?", min_score=0.5) # text "" and abstained=True when no answer is that likely

Contexts of any length: a context longer than the reader's window (the context length it was trained on) is
read in overlapping windows, and offsets are always into the text given (``fastqa.tasks.qa.inference``).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import torch
from torch import nn

from ..._checks import check_int, check_number
from ...bounds import check_fits, checked
from ...data.vocab import Vocab
from ...errors import UserError
from ...train.distributed import default_device
from ..loading import cpu_threads, inference_dtype, load_weights, open_model, unreadable_meta
from .calibration import Calibration
from .readers import answer_len, build_model, config_type
from .encoding import EncodedPair, encode_pairs
from .squad import Limits, SquadSet, encode_squad, load_squad
from .spec import SPEC
from .task import PredictOutput, predict
from .inference import BatchHook, Passage, Query, ReadOptions, Reading, read_windows, window_settings

__all__ = ["Answer", "QAModel", "answers_json", "whole_words"]


@dataclass(frozen=True)
class Answer:
    """An answer found in a context: ``context[start:end] == text`` (character offsets).

    score: the estimated probability that the answer is right for a calibrated reader, else the span's
    probability over the context; no_answer_prob: a v2.0 reader's probability that the context holds no answer
    (None for a v1.1 reader); abstained: no answer scored ``min_score`` or more (``text`` is then "")."""

    text: str
    start: int
    end: int
    score: float
    no_answer_prob: float | None = None
    abstained: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, every field always present."""
        return asdict(self)


def answers_json(answers: Sequence[Answer]) -> dict[str, Any]:
    """The JSON of one question's answers, best first, as ``fastqa ask`` prints it and the server sends it:
    ``{"answer": the best, "answers": all of them}``."""
    return {"answer": answers[0].to_dict(), "answers": [a.to_dict() for a in answers]}


_HYPHENS = frozenset("-\u2010\u2011")  # hyphen-minus, hyphen, non-breaking hyphen


def whole_words(tokens: Sequence[str], offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The token span [start, end] widened to whole hyphenated words: the tokenizer splits "Delamarre-Fontclaire"
    into three tokens, and an answer that stops at the hyphen cuts a name a reader sees as one word."""
    def joined(i: int) -> bool:  # token i is a hyphen touching a word on both sides
        return (0 < i < len(tokens) - 1 and tokens[i] in _HYPHENS and offsets[i - 1][1] == offsets[i][0]
                and offsets[i][1] == offsets[i + 1][0] and tokens[i - 1][-1:].isalnum() and tokens[i + 1][:1].isalnum())
    while end + 2 < len(tokens) and joined(end + 1):
        end += 2
    while start >= 2 and joined(start - 1):
        start -= 2
    return start, end


class QAModel:
    """A trained reader (QANet or a recurrent baseline) with its vocabularies: answers questions about a context
    (EMA weights)."""

    def __init__(self, model: nn.Module, words: Vocab, chars: Vocab, *, max_answer_len: int = 30,
                 limits: Limits = Limits(), device: torch.device | str | None = None,
                 calibration: Calibration | None = None, dtype: torch.dtype | None = None,
                 graphs: bool | None = None) -> None:
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        #: the weights' dtype when one was asked for (``Predictor.load``'s precision); None: as saved, and on a
        #: GPU under bf16 autocast
        self.dtype = dtype
        self.model = model.to(self.device, dtype).eval()
        self.config = model.config
        self.words, self.chars = words, chars
        self.max_answer_len = max_answer_len
        self.limits = limits
        #: maps raw scores to probabilities of being right (``fastqa.tasks.qa.calibration``); None: raw scores
        self.calibration = calibration
        #: a QANet reads through static buffers, a CUDA graph per bucket (``read_windows``' graphs; default: on CUDA)
        self.graphs = self.device.type == "cuda" if graphs is None else bool(graphs)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike | None = None, *, device: str | torch.device | None = None,
             layers: str | None = None, threads: int | None = None, precision: str | None = None) -> "QAModel":
        """The reader ``name_or_path`` names: a run folder (or its checkpoint.pt), a slim export (``fastqa
        export``), or a shipped model's name (``fastqa.pretrained.NAMES``); None loads the shipped reader,
        "qanet-small-squad". Config, vocabularies and calibration come with the weights (the EMA's when the run
        kept them). The ``Predictor`` contract (``fastqa.tasks.loading``): device None picks a CUDA GPU when
        there is one; layers: QANet's "fast" (default), "reference", "naive"; threads: CPU threads; precision:
        "fp32", "bf16" or None (``fastqa.tasks.loading.inference_dtype``)."""
        cpu_threads(threads)
        device = default_device(device)
        dtype = inference_dtype(precision, device)
        payload, where, meta = open_model(name_or_path, SPEC.shipped, SPEC.kinds, "a reader's")
        kind = payload["kind"]
        if layers is not None and kind != "qanet":
            raise UserError(f"--layers chooses QANet's layers; the {kind} reader in {where} has none")
        with unreadable_meta(where):
            extra = {"layers": layers or "fast"} if kind == "qanet" else {}
            config = config_type(kind).from_dict({**meta["config"], **extra})
            words, chars = Vocab.from_dict(meta["words"]), Vocab.from_dict(meta["chars"])
            limits = Limits(**meta["limits"]) if "limits" in meta else Limits()
            max_answer_len = int(meta.get("max_answer_len", 30))
            calibration = (Calibration.from_dict(meta["calibration"], f"{where}: calibration")
                           if meta.get("calibration") is not None else None)
        sizes = (config.word_vocab_size, getattr(config, "char_vocab_size", len(chars)))
        if sizes != (len(words), len(chars)):
            raise UserError(f"{where}: the checkpoint's vocabularies ({len(words)} words, {len(chars)} chars) do not "
                            f"match its config {sizes}")
        model = build_model(config)
        load_weights(model, payload, where)
        return cls(model, words, chars, max_answer_len=max_answer_len, limits=limits, device=device,
                   calibration=calibration, dtype=dtype)

    @property
    def char_limit(self) -> int:
        """Characters kept per word: the window the character CNN was trained on (QANet's ``max_word_len``;
        the training limits for a reader that has none)."""
        return int(getattr(self.config, "max_word_len", self.limits.chars))

    # -- free text

    def windows(self, max_context: int | None = None, stride: int | None = None) -> tuple[int, int]:
        """(max_context, stride) with their defaults: the context length the reader was trained on
        (``limits.context``) and ``DEFAULT_STRIDE`` tokens of overlap (see ``fastqa.tasks.qa.inference``)."""
        return window_settings(max_context, stride, self.limits.context)

    def _read(self, pairs: Sequence[EncodedPair], *, k: int, batch_size: int, max_answer_len: int | None,
              window: int, overlap: int, texts: Sequence[str] | None = None,
              on_batch: BatchHook | None = None, keep_scores: bool = False) -> list[Reading]:
        """Read ``pairs`` in windows of ``window`` tokens overlapping by ``overlap`` (``windows``' settings)."""
        batch_size = check_int("batch_size", batch_size, low=1)
        mal = answer_len(self.config, self.max_answer_len if max_answer_len is None else max_answer_len)
        options = ReadOptions(k=k, max_answer_len=mal, max_context=window, stride=overlap, batch_size=batch_size,
                              word_pad=self.words.pad_id, char_pad=self.chars.pad_id, device=self.device,
                              autocast=self.dtype is None, keep_scores=keep_scores, graphs=self.graphs)
        # Pairs about one text share its encoding (``encode_pairs``): one passage, its windows planned once.
        index: dict[int, int] = {}
        passages: list[Passage] = []
        questions: list[Query] = []
        for i, p in enumerate(pairs):
            c = index.setdefault(id(p.context_words), len(passages))
            if c == len(passages):
                passages.append(Passage(p.context_words, p.context_chars, p.context_tokens,
                                        None if texts is None else texts[i], p.offsets))
            questions.append(Query(p.question_words, p.question_chars, c, p.question_tokens))
        return read_windows(self.model, passages, questions, options, on_batch=on_batch)

    def _check_memory(self, lengths: Sequence[int], batch_size: int, window: int, overlap: int) -> None:
        """Refuse, with one line, a reading whose batch of windows cannot fit in the free memory: each window
        row holds its self-attention maps (heads x length^2) and its activations (width x length), the length
        being the longest window (rows are padded to it), for the rows of one batch (at most ``batch_size``, at
        most the windows there are). ``lengths``: the tokens of each text read; window, overlap: ``windows``'
        settings."""
        rows = min(batch_size, sum(max(1, -(-(n - overlap) // max(1, window - overlap))) for n in lengths))
        length = min(window, max(lengths, default=1))
        heads, width = int(getattr(self.config, "heads", 1)), int(getattr(self.config, "d_model", 128))
        need = 4 * rows * (3 * heads * length * length + 20 * width * length)
        check_fits(f"reading {rows} windows of {length} tokens at once (batch_size {batch_size}, max_context "
                   f"{window})", need, device=self.device, advice="lower batch_size (--batch-size) or max_context")

    def _score(self, raw: float) -> float:
        return self.calibration(raw) if self.calibration is not None else raw

    def _distinct(self, context: str, pair: EncodedPair, reading: Reading, na_prob: float | None
                  ) -> list[tuple[float, Answer]]:
        """(log score, answer) of the candidates that overlap no better one, best first."""
        offsets = pair.offsets
        ranked: list[tuple[float, Answer]] = []
        taken: list[tuple[int, int]] = []
        for c in reading.candidates:
            start, end = whole_words(pair.context_tokens, offsets, c.start, c.end)
            first, last = offsets[start][0], offsets[end][1]
            if any(first < b and a < last for a, b in taken):
                continue
            taken.append((first, last))
            ranked.append((c.log_score, Answer(context[first:last], first, last, self._score(c.score), na_prob)))
        return ranked

    def _answers(self, context: str, pair: EncodedPair, reading: Reading, k: int,
                 min_score: float | None) -> list[Answer]:
        """The k best distinct answers of ``reading``, best first: each span widened to whole hyphenated words
        (``whole_words``), and a span that overlaps a better one left out ("13 July 2014" hides "on 13 July
        2014"). The candidate pool grows (``Reading.widen``) until k spans overlap no better one or the text has
        no more spans, so k answers come back whenever the text has k. A v2.0 reader's "no answer" is one of
        them, ranked by its score like the spans (first exactly when it wins: a stable sort keeps it after a span
        of equal score, as ``is_null`` needs it strictly larger). Below ``min_score`` a span is no confident
        answer."""
        na_prob = reading.na_prob if self.config.no_answer else None
        ranked = self._distinct(context, pair, reading, na_prob)
        while len(ranked) < k and reading.can_widen:
            reading.widen(4 * reading.asked)
            ranked = self._distinct(context, pair, reading, na_prob)
        if self.config.no_answer:
            ranked.append((reading.log_null, Answer("", 0, 0, self._score(reading.null_score), na_prob)))
            ranked.sort(key=lambda a: -a[0])
        answers = [a for _, a in ranked[:k]]
        if min_score is None:
            return answers
        confident = [a for a in answers if not a.text or a.score >= min_score]
        # None confident: one answer that says so; the text goes, the score stays, to show how far below it was.
        return confident or [Answer("", 0, 0, answers[0].score, na_prob, abstained=True)]

    def answer_many(self, contexts: Sequence[str], questions: Sequence[str], *, batch_size: int = 32,
                    max_answer_len: int | None = None, top_k: int | None = None, max_context: int | None = None,
                    stride: int | None = None, min_score: float | None = None) -> list[Answer] | list[list[Answer]]:
        """``answer`` for every (context, question) pair, their windows batched together by length: one
        ``Answer`` per pair, or with ``top_k`` one list per pair."""
        found, _, _ = self._answer_pairs(contexts, questions, batch_size=batch_size, max_answer_len=max_answer_len,
                                         top_k=top_k, max_context=max_context, stride=stride, min_score=min_score)
        return [answers[0] for answers in found] if top_k is None else found

    def _answer_pairs(self, contexts: Sequence[str], questions: Sequence[str], *, batch_size: int,
                      max_answer_len: int | None, top_k: int | None, max_context: int | None, stride: int | None,
                      min_score: float | None, on_batch: BatchHook | None = None
                      ) -> tuple[list[list[Answer]], list[Reading], list[EncodedPair]]:
        """(each pair's answers, its reading, its encoding): ``answer_many`` with what it was found from."""
        if min_score is not None:
            min_score = check_number("min_score", min_score, low=0, high=1, error=ValueError)
        if len(contexts) != len(questions):
            raise ValueError(f"contexts and questions differ in length ({len(contexts)} vs {len(questions)})")
        top_k, batch_size, max_answer_len, max_context, stride = checked(
            top_k=top_k, batch_size=batch_size, max_answer_len=max_answer_len, max_context=max_context, stride=stride)
        pairs = encode_pairs(contexts, questions, self.words, self.chars, self.char_limit)
        window, overlap = self.windows(max_context, stride)
        self._check_memory([len(p) for p in pairs], batch_size, window, overlap)
        # More candidates than answers: the spans that overlap a better one are left out (and the window scores
        # kept, for a pool that must grow: ``_answers``).
        several = top_k not in (None, 1)
        readings = self._read(pairs, k=4 * top_k if several else 1, batch_size=batch_size,
                              max_answer_len=max_answer_len, window=window, overlap=overlap, texts=contexts,
                              on_batch=on_batch, keep_scores=several)
        found = [self._answers(c, p, r, top_k or 1, min_score) for c, p, r in zip(contexts, pairs, readings)]
        return found, readings, pairs

    def answer(self, context: str, question: str, *, max_answer_len: int | None = None, top_k: int | None = None,
               max_context: int | None = None, stride: int | None = None, batch_size: int = 32,
               min_score: float | None = None) -> Answer | list[Answer]:
        """The ``Answer`` to ``question`` in ``context``: ``text`` with ``context[start:end] == text``, and
        ``score``: the estimated probability that the answer is right when the model is calibrated
        (``calibration``; the shipped reader is), else the span's probability over the context. A v2.0 reader's
        "no answer" is ``text`` "" (it also gives ``no_answer_prob``).

        top_k: the list of the k best distinct answers, best first (a v2.0 reader's "no answer" is one of them,
        ranked by its score). min_score: the answers below it are dropped; when none is left, the answer (the
        list's one answer) has ``text`` "" and ``abstained`` True, and the best answer's score, to show how far
        below it was. A context longer than ``max_context`` tokens (default: the length the reader was
        trained on) is read in windows overlapping by ``stride`` tokens, ``batch_size`` windows at a time;
        offsets are always into ``context``."""
        return self.answer_many([context], [question], max_answer_len=max_answer_len, top_k=top_k,
                                max_context=max_context, stride=stride, batch_size=batch_size,
                                min_score=min_score)[0]

    def answer_with_probabilities(self, context: str, question: str, **kwargs: Any
                                  ) -> tuple[Answer | list[Answer], dict[str, Any]]:
        """(``answer(context, question, **kwargs)``, the start/end probabilities of the window that holds the best
        answer), from one reading: what ``ask --plot`` draws beside the answer it prints.

        The probabilities: ``tokens``, ``offsets`` (character spans in ``context``), ``p_start`` and ``p_end``
        (lists of floats; ``p_end`` None for a single-word reader, whose answer ends where it starts), ``p_null``
        (start·end of "no answer", v2.0 models), and ``window`` (first, end) with ``n_tokens``: the token range
        these cover out of the context's. A context longer than the reader's window is read in windows, each with
        a softmax of its own."""
        rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def keep(units: list[tuple[int, int]], inputs: Any, lp1: torch.Tensor, lp2: torch.Tensor) -> None:
            for row, (_, wi) in enumerate(units):
                rows[wi] = (lp1[row].exp().cpu(), lp2[row].exp().cpu())
        top_k = kwargs.pop("top_k", None)
        options = {"batch_size": 32, "max_answer_len": None, "max_context": None, "stride": None, "min_score": None,
                   **kwargs}
        (found,), (reading,), (pair,) = self._answer_pairs([context], [question], top_k=top_k, on_batch=keep,
                                                           **options)
        wi = reading.answer_window
        a, b = reading.windows[wi]
        p1, p2 = rows[wi]
        extra = 1 if self.config.no_answer else 0   # a v2.0 reader's position 0 is "no answer"
        out: dict[str, Any] = {"tokens": pair.context_tokens[a:b], "offsets": pair.offsets[a:b], "p_null": None,
                               "window": (a, b), "n_tokens": len(pair)}
        if extra:
            out["p_null"] = float(p1[0] * p2[0])
        out["p_start"] = p1[extra:extra + b - a].tolist()
        out["p_end"] = None if self.config.single_word else p2[extra:extra + b - a].tolist()
        return (found if top_k is not None else found[0]), out

    def probabilities(self, context: str, question: str, *, max_context: int | None = None,
                      stride: int | None = None) -> dict[str, Any]:
        """The start/end probabilities of the window that holds the best answer (``answer_with_probabilities``)."""
        return self.answer_with_probabilities(context, question, max_context=max_context, stride=stride)[1]

    # -- files
    def predict_file(self, path: str | os.PathLike, *, articles: str | None = None, batch_size: int = 32,
                     cache_dir: str | os.PathLike | None = None, progress: bool = True,
                     max_context: int | None = None, stride: int | None = None) -> tuple[SquadSet, PredictOutput]:
        """Answer every question of a SQuAD file (optionally some articles): (the data, PredictOutput).

        Contexts longer than ``max_context`` tokens (default: the reader's training length) are read in
        windows overlapping by ``stride`` tokens, as ``answer`` does. Paragraphs with an empty or
        whitespace-only context are skipped with a logged count (see ``fastqa.tasks.qa.squad``): their
        questions get no prediction."""
        batch_size, max_context, stride = checked(batch_size=batch_size, max_context=max_context, stride=stride)
        window, overlap = self.windows(max_context, stride)
        data = load_squad(path, articles, cache_dir=cache_dir, progress=progress)
        self._check_memory([len(c.tokens) for c in data.contexts], batch_size, window, overlap)
        limits = replace(self.limits, chars=self.char_limit)
        enc = encode_squad(data, self.words, self.chars, train=False, no_answer=self.config.no_answer,
                           limits=limits, cache_dir=cache_dir)
        out = predict(self.model, data, enc, batch_size=batch_size, max_answer_len=self.max_answer_len,
                      device=self.device, progress=progress, max_context=window, stride=overlap)
        out.scores = {qid: self._score(raw) for qid, raw in out.scores.items()}
        return data, out
