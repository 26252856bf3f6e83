"""The models behind the server, each loaded once and called from a worker thread of its own.

Why one worker thread per model, not a call per request on a shared pool:

* A model call is CPU-bound PyTorch work that already spreads one forward pass over the cores (intra-op
  threads). Two passes of the same model at once would fight over those cores and each would finish later,
  so running them one after the other loses no throughput and keeps each request's latency low.
* The model objects are written for one caller at a time (``Translator`` records ``last_stats`` per call;
  backends build and cache kernel plans on first use), so serialising the calls per model keeps them safe.
* The QA reader and the translator have a thread each, so a long translation does not hold up an answer,
  and the event loop never runs a model: ``/health`` and the page answer at once while models work.
* Waiting requests are futures in the worker's queue, not threads blocked on a lock, and the queue is
  bounded (``ServeLimits.max_pending``): past it a request gets 503 at once instead of waiting without end.

Only the documented calls of ``QAModel`` and ``Translator`` are used, and their newer keyword arguments
(``QAModel.answer(top_k=)``, ``Translator.translate(nbest=, attention=)``) only where the loaded class's
signature has them: without ``top_k`` the list is ranked here from ``QAModel.probabilities``, without
``nbest`` the attention comes from ``Translator.attention``.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from ..errors import UserError

__all__ = ["Busy", "ModelWorker", "QAEngine", "TranslationEngine", "top_spans", "accepts"]

T = TypeVar("T")


class Busy(RuntimeError):
    """A model already has ``max_pending`` requests waiting; the server answers 503 with Retry-After."""


def accepts(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` takes a keyword argument ``name`` (explicitly; ``**kwargs`` does not count, since
    a catch-all would pass an unknown argument on to something that rejects it)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ModelWorker:
    """One model with the thread that runs it and a bounded count of requests waiting for it."""

    _names = itertools.count()

    def __init__(self, model: Any, *, name: str, path: str | None = None, max_pending: int = 256) -> None:
        self.model = model
        self.name = name
        self.path = path
        self.max_pending = max_pending
        self.pending = 0  # touched only from the event loop's thread, so a plain int is enough
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` on this model's thread; Busy when too many requests wait already."""
        if self.pending >= self.max_pending:
            raise Busy(f"the {self.name} model has {self.pending} requests waiting; retry in a moment")
        if self._executor is None:  # created on first use: a worker built in a test and never called costs nothing
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fastqa-{self.name}")
        self.pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, lambda: function(*args, **kwargs))
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Stop the thread once the calls in its queue are done."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


# ------------------------------------------------------------------------------------------------- QA

def top_spans(probabilities: dict[str, Any], context: str, k: int, max_answer_len: int) -> list[dict[str, Any]]:
    """The ``k`` best answer spans from ``QAModel.probabilities(context, question)``: score(i, j) =
    p_start(i)·p_end(j) with i <= j <= i + max_answer_len, as the reader's own decoding scores a span; each
    ``{"text", "score", "start", "end"}`` with ``context[start:end] == text``, best first. A single-word
    reader (``p_end`` None) scores the one-token spans by p_start."""
    import torch

    offsets = probabilities["offsets"]
    p_start = torch.tensor(probabilities["p_start"], dtype=torch.float64)
    n = p_start.numel()
    if n == 0 or k < 1:
        return []
    if probabilities.get("p_end") is None:
        width = 1
        scores = p_start[:, None]
        valid = torch.ones(n, 1, dtype=torch.bool)
    else:
        p_end = torch.tensor(probabilities["p_end"], dtype=torch.float64)
        width = min(max(max_answer_len, 0), n - 1) + 1
        # A band rather than the n x n matrix: row i holds the spans starting at i, column d those d tokens long.
        ends = torch.arange(n)[:, None] + torch.arange(width)[None, :]
        valid = ends < n
        scores = torch.where(valid, p_start[:, None] * p_end[ends.clamp(max=n - 1)], torch.tensor(-1.0, dtype=torch.float64))
    k = min(k, int(valid.sum()))
    values, flat = scores.flatten().topk(k)
    spans = []
    for value, index in zip(values.tolist(), flat.tolist()):
        i, d = divmod(index, width)
        start, end = offsets[i][0], offsets[i + d][1]
        spans.append({"text": context[start:end], "score": value, "start": start, "end": end})
    return spans


def _native_top_k(result: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the best answer, the answers best first) of what ``QAModel.answer(..., top_k=k)`` returned:
    ``{"answers": [...]}`` (with ``no_answer_prob`` from a v2.0 reader, which belongs to the best answer, as
    ``answer`` without top_k gives it). A plain list of answers is read too."""
    if isinstance(result, dict) and isinstance(result.get("answers"), list):
        answers = [dict(a) for a in result["answers"]]
        extra = {key: value for key, value in result.items() if key != "answers"}
    elif isinstance(result, list):
        answers, extra = [dict(a) for a in result], {}
    else:
        raise TypeError(f"QAModel.answer(top_k=) returned {type(result).__name__}, expected {{'answers': [...]}}")
    if not answers:
        raise TypeError("QAModel.answer(top_k=) returned no answers")
    return {**answers[0], **extra}, answers


class QAEngine(ModelWorker):
    """A ``QAModel`` behind the server: the best answer and the top-k list of one (context, question)."""

    def __init__(self, model: Any, *, path: str | None = None, max_pending: int = 256) -> None:
        super().__init__(model, name="qa", path=path, max_pending=max_pending)
        #: QAModel.answer takes top_k itself (then its list is used; else the list comes from probabilities).
        self.native_top_k = accepts(model.answer, "top_k")
        self.default_max_answer_len = int(getattr(model, "max_answer_len", 30))

    def describe(self) -> dict[str, Any]:
        """What ``/health`` says about this model."""
        config = getattr(self.model, "config", None)
        return {"path": self.path, "model": type(getattr(self.model, "model", self.model)).__name__,
                "device": str(getattr(self.model, "device", "cpu")),
                "no_answer": bool(getattr(config, "no_answer", False)),
                "max_answer_len": self.default_max_answer_len,
                "top_k": "model" if self.native_top_k else "spans"}

    def answer(self, context: str, question: str, *, top_k: int = 1, max_answer_len: int | None = None
               ) -> dict[str, Any]:
        """``{"answer": {...}, "top_k": [...]}``: the model's answer (``QAModel.answer``) and the ``top_k``
        best spans, best first (``[answer]`` when top_k is 1). Runs the model: call it on the worker thread."""
        kwargs: dict[str, Any] = {} if max_answer_len is None else {"max_answer_len": max_answer_len}
        if self.native_top_k and top_k > 1:
            best, answers = _native_top_k(self.model.answer(context, question, top_k=top_k, **kwargs))
            return {"answer": best, "top_k": answers[:top_k]}
        best = self.model.answer(context, question, **kwargs)
        if top_k == 1:
            return {"answer": best, "top_k": [best]}
        # A second forward pass for the probabilities: the price of a top-k list until the reader gives one.
        probabilities = self.model.probabilities(context, question)
        mal = self.default_max_answer_len if max_answer_len is None else max_answer_len
        return {"answer": best, "top_k": top_spans(probabilities, context, top_k, mal)}


# --------------------------------------------------------------------------------------------- translation

def attention_dict(amap: Any, digits: int = 4) -> dict[str, Any]:
    """An ``AttentionMap`` (source and target tokens, weights [T, S]) as JSON: ``source``, ``target`` and
    ``weights`` (one row per target token, one column per source token), rounded to keep responses small."""
    weights = amap.weights.tolist() if hasattr(amap.weights, "tolist") else amap.weights
    return {"source": list(amap.source), "target": list(amap.target),
            "weights": [[round(float(w), digits) for w in row] for row in weights]}


class TranslationEngine(ModelWorker):
    """A ``Translator`` behind the server: translations, with attention maps and n-best lists on request."""

    def __init__(self, model: Any, *, path: str | None = None, max_pending: int = 256) -> None:
        super().__init__(model, name="translation", path=path, max_pending=max_pending)
        # Translator.translate(nbest=, attention=) gives hypotheses with their attention from the search itself;
        # without it the attention comes from Translator.attention, which decodes the sentence once more.
        self.native_nbest = accepts(model.translate, "nbest") and accepts(model.translate, "attention")

    def describe(self) -> dict[str, Any]:
        """What ``/health`` says about this model."""
        return {"path": self.path, "device": str(getattr(self.model, "device", "cpu")),
                "vocab": getattr(self.model, "vocab_kind", "word"),
                "max_positions": getattr(getattr(self.model, "config", None), "max_positions", None),
                "attention": True, "nbest": self.native_nbest}

    def translate(self, sentences: Sequence[str], *, beam: int = 5, attention: bool = False,
                  nbest: int | None = None) -> list[dict[str, Any]]:
        """One ``{"source", "text"}`` per sentence (``"attention"`` when asked: the best translation's map;
        ``"nbest"``: ``[{"text", "score"}]`` best first). An empty sentence translates to "" with no map.
        Runs the model: call it on the worker thread."""
        if nbest is not None and not self.native_nbest:
            raise UserError("nbest: this translator gives one translation per sentence (no n-best lists)")
        out: list[dict[str, Any]] = [{"source": s} for s in sentences]
        if self.native_nbest and (attention or nbest is not None):
            hypotheses = self.model.translate(list(sentences), beam=beam, nbest=nbest or 1, attention=attention)
            for row, hyps in zip(out, hypotheses):
                row["text"] = hyps[0].text if hyps else ""
                if attention:
                    row["attention"] = attention_dict(hyps[0].attention) if hyps and hyps[0].attention else None
                if nbest is not None:
                    row["nbest"] = [{"text": h.text, "score": float(h.score)} for h in hyps]
            return out
        for row, text in zip(out, self.model.translate(list(sentences), beam=beam)):
            row["text"] = text
        if attention:
            for row in out:
                # Translator.attention decodes with the same beam, so its target is the translation above.
                row["attention"] = self._attention(row["source"], beam)
        return out

    def _attention(self, sentence: str, beam: int) -> dict[str, Any] | None:
        """The map of one sentence through ``Translator.attention``; None for one with no tokens."""
        if not sentence.strip():
            return None
        try:
            return attention_dict(self.model.attention(sentence, beam=beam))
        except UserError:  # nothing the model reads (the translator says the sentence is empty)
            return None
