"""The models behind the server: each loaded once, its requests batched (``batcher.Batcher``) and answered as its
task's ``Serving`` says (``fastqa.tasks.spec``; ``QAModel.answer_many``, ``Translator.translate``).

A batch mixes requests with different options (top_k, beam...): the requests that share them are answered by one
call, so a batch costs a call per distinct set of options, usually one. A request the model refuses (a text it
cannot read) must not fail the others of its batch: a call that fails is retried one request at a time, and only
the request at fault gets the error.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence, TypeVar

from .batcher import Batcher

__all__ = ["Engine", "grouped"]

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


class Engine:
    """A task's model and the batcher that feeds it: each request's result (or the exception it raised), the
    items of a batch that share the task's ``Serving.key`` answered by one ``Serving.run`` call."""

    def __init__(self, name: str, model: Any, serving: Any, *, path: str | None = None,
                 on_batch: Callable[[int, float], None] | None = None, **batching: Any) -> None:
        """name: the task's; serving: its ``fastqa.tasks.spec.Serving``; batching: ``Batcher``'s bounds
        (max_batch, max_wait_ms, idle_ms, max_pending)."""
        self.name, self.model, self.serving, self.path = name, model, serving, path
        self.batcher: Batcher = Batcher(self._run, name=name, on_batch=on_batch, **batching)

    def describe(self) -> dict[str, Any]:
        """What ``/health`` says about this model."""
        return {"path": self.path, **self.serving.describe(self.model)}

    def warm_up(self) -> None:
        """Answer one small request: what loads on first use (the tokenizer, the kernels' first calls) is loaded
        before the server listens, not by its first client."""
        self.serving.warm_up(self.model)

    def _run(self, items: list) -> list[Any]:
        return grouped(items, self.serving.key, lambda group: self.serving.run(self.model, group))
