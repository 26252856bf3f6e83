"""The models behind the server: each loaded once, its requests batched (``batcher.Batcher``) and answered through
the inference contract (``QAModel.answer_many``, ``Translator.translate``).

A batch mixes requests with different options (top_k, beam...): the requests that share them are answered by one
call, so a batch costs a call per distinct set of options, usually one. A request the model refuses (a text it
cannot read) must not fail the others of its batch: a call that fails is retried one request at a time, and only
the request at fault gets the error.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence, TypeVar

from .batcher import Batcher

__all__ = ["AnswerItem", "TranslateItem", "QAEngine", "TranslationEngine", "grouped"]

I = TypeVar("I")  # noqa: E741


def grouped(items: Sequence[I], key: Callable[[I], Hashable], run: Callable[[list[I]], list[Any]]) -> list[Any]:
    """``run`` over the items that share a ``key``, results back in the items' order. A ``ValueError`` (what the
    models raise for input they cannot read, ``UserError`` included) from a group of several is retried item by
    item, so that it is the result of the item at fault only."""
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item), []).append(i)
    results: list[Any] = [None] * len(items)
    for indices in groups.values():
        try:
            found = run([items[i] for i in indices])
        except ValueError:
            if len(indices) == 1:
                raise
            found = []
            for i in indices:
                try:
                    found.extend(run([items[i]]))
                except ValueError as e:
                    found.append(e)
        for i, result in zip(indices, found):
            results[i] = result
    return results


@dataclass(frozen=True)
class AnswerItem:
    context: str
    question: str
    top_k: int = 1
    max_answer_len: int | None = None
    min_score: float | None = None


@dataclass(frozen=True)
class TranslateItem:
    sentences: tuple[str, ...]
    beam: int = 5
    nbest: int = 1
    attention: bool = False


class _Engine(abc.ABC):
    """A model and the batcher that feeds it (``_run``: one batch of items -> one result per item)."""

    name = "model"

    def __init__(self, model: Any, *, path: str | None = None, on_batch: Callable[[int, float], None] | None = None,
                 **batching: Any) -> None:
        """batching: ``Batcher``'s bounds (max_batch, max_wait_ms, idle_ms, max_pending)."""
        self.model, self.path = model, path
        self.batcher: Batcher = Batcher(self._run, name=self.name, on_batch=on_batch, **batching)

    @abc.abstractmethod
    def _run(self, items: list) -> list[Any]:
        """One result (or the exception it raised) per item, in order: what the batcher hands its callers."""

    @abc.abstractmethod
    def warm_up(self) -> None:
        """Answer one small request: what loads on first use (the tokenizer, the kernels' first calls) is loaded
        before the server listens, not by its first client."""


def _dtype_name(model: Any) -> str:
    """The dtype of a model's weights, as ``--precision`` names it in torch: "float32", "bfloat16"."""
    return str(next(model.parameters()).dtype).replace("torch.", "")


class QAEngine(_Engine):
    """A ``QAModel`` behind the server: each request's answers (``list[Answer]``, best first)."""

    name = "qa"

    def describe(self) -> dict[str, Any]:
        """What ``/health`` says about this model."""
        return {"path": self.path, "model": type(self.model.model).__name__, "device": str(self.model.device),
                "dtype": _dtype_name(self.model.model), "no_answer": bool(self.model.config.no_answer),
                "max_answer_len": int(self.model.max_answer_len), "calibrated": self.model.calibration is not None}

    def warm_up(self) -> None:
        self.model.answer("Words to read.", "What is read?")

    def _run(self, items: list[AnswerItem]) -> list[Any]:
        def answer(group: list[AnswerItem]) -> list[Any]:
            first = group[0]
            return self.model.answer_many([it.context for it in group], [it.question for it in group],
                                          top_k=first.top_k, max_answer_len=first.max_answer_len,
                                          min_score=first.min_score, batch_size=max(32, len(group)))
        return grouped(items, lambda it: (it.top_k, it.max_answer_len, it.min_score), answer)


class TranslationEngine(_Engine):
    """A ``Translator`` behind the server: each request's ``Translation`` per sentence."""

    name = "translation"

    def describe(self) -> dict[str, Any]:
        """What ``/health`` says about this model."""
        return {"path": self.path, "device": str(self.model.device), "dtype": _dtype_name(self.model.model),
                "vocab": self.model.vocab_kind,
                "max_positions": self.model.config.max_positions}

    def warm_up(self) -> None:
        self.model.translate(["words"], beam=1)

    def _run(self, items: list[TranslateItem]) -> list[Any]:
        def translate(group: list[TranslateItem]) -> list[Any]:
            first = group[0]
            # The sentences of every request of the group decode as one batch, then go back to their requests.
            found = self.model.translate([s for it in group for s in it.sentences], beam=first.beam,
                                         nbest=first.nbest, attention=first.attention)
            out, at = [], 0
            for it in group:
                out.append(found[at:at + len(it.sentences)])
                at += len(it.sentences)
            return out
        return grouped(items, lambda it: (it.beam, it.nbest, it.attention), translate)
