"""What a task is to the rest of the package: one ``TaskSpec`` per task folder, which the command line, ``fastqa
serve``, the shipped models' listing and the trainer's expectation line read instead of naming the tasks.

    TaskSpec   its name, its commands, its predictor (``load``), the checkpoint kinds that predictor reads,
               its shipped model, how ``fastqa serve`` puts it behind HTTP (``Serving``, by module path) and
               the documented runs of its recipes (``ReferenceRun``)
    Serving    its route, request and response schemas, and how a batch of requests is answered

Nothing here imports torch, pydantic or a task's modules: a spec names them as "module:attribute" and they
load on first use, so ``fastqa --help`` stays light.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping

__all__ = ["TaskSpec", "Serving", "ReferenceRun", "weights_dtype"]


def _attribute(path: str) -> Any:
    """The object "package.module:attribute" names (its module imported on first use)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ReferenceRun:
    """A documented run of a recipe: what it reached, after how many steps and minutes, on what machine,
    and what its evaluations read early on (``early``). The trainer quotes it in its expectation line."""

    result: str
    steps: int
    minutes: float
    machine: str
    early: str
    source: str = "docs/models.md"

    @property
    def steps_per_minute(self) -> float:
        return self.steps / self.minutes


@dataclass(frozen=True)
class Serving:
    """A task behind ``fastqa serve``: ``POST route`` takes ``request_schema(limits)`` (a pydantic model whose
    bounds are the server's ``ServeLimits``) and answers ``response_schema``. Each request becomes one ``item``
    (hashable, frozen) of the model's batcher; the items of a batch that share ``key`` are answered by one
    ``run(model, items)`` call (one result per item); ``respond(request, result)`` is the response's JSON."""

    route: str
    name: str  # the route function's name (the OpenAPI operation)
    summary: str  # what the route does, one sentence (the OpenAPI description)
    request_schema: Callable[[Any], type]
    response_schema: type
    item: Callable[[Any], Hashable]
    key: Callable[[Any], Hashable]
    run: Callable[[Any, list], list]
    respond: Callable[[Any, Any], dict[str, Any]]
    describe: Callable[[Any], dict[str, Any]]  # what /health says about the model (its path is added)
    warm_up: Callable[[Any], None]  # one small request, so the first client does not pay for loading


@dataclass(frozen=True)
class TaskSpec:
    """One task: everything the command line, the server, the shipped models and the trainer know of it.

    name: "qa" (the server's name for its model, a shipped model's "task"); commands: the module whose
    ``register(subparsers)`` adds its subcommands; predictor: "module:Class" of its ``Predictor`` (``load``);
    kinds: the checkpoint kinds that predictor reads; shipped: the shipped model its ``load()`` reads when given
    no name (None: none ships); serving: "module:SERVING" (a ``Serving``; None: not served); serve_flag and
    serve_help: ``fastqa serve``'s flag that names its model ("--qa-model"); reference_runs: (kind, preset) ->
    the documented run of that recipe."""

    name: str
    commands: str
    predictor: str
    kinds: tuple[str, ...]
    shipped: str | None = None
    serving: str | None = None
    serve_flag: str | None = None
    serve_help: str = ""
    reference_runs: Mapping[tuple[str, str], ReferenceRun] = field(default_factory=dict)

    @classmethod
    def in_folder(cls, package: str, **fields: Any) -> "TaskSpec":
        """The spec of the task folder ``package`` (a spec module passes its ``__package__``): its commands are
        ``package.cli`` and its serving ``package.serving:SERVING``, as a task folder lays them out, unless
        ``fields`` names others; ``fields`` gives the rest."""
        fields.setdefault("commands", f"{package}.cli")
        fields.setdefault("serving", f"{package}.serving:SERVING")
        return cls(**fields)

    def register(self, subparsers: Any) -> None:
        """Add the task's subcommands to the ``fastqa`` command."""
        importlib.import_module(self.commands).register(subparsers)

    def load(self, name_or_path: str | os.PathLike | None = None, **options: Any) -> Any:
        """The task's predictor: ``Predictor.load(name_or_path, **options)``."""
        return _attribute(self.predictor).load(name_or_path, **options)

    def load_serving(self) -> Serving:
        if self.serving is None:
            raise ValueError(f"the {self.name} task is not served")
        return _attribute(self.serving)

    @property
    def serve_dest(self) -> str:
        """The attribute of the parsed ``fastqa serve`` flags that holds the model's path ("qa_model")."""
        return (self.serve_flag or "").lstrip("-").replace("-", "_")

    def reference_run(self, kind: str, preset: str | None) -> ReferenceRun | None:
        """The documented run of ``kind`` with ``preset`` (None: no preset known, or no run documented)."""
        return None if preset is None else self.reference_runs.get((kind, preset))


def weights_dtype(model: Any) -> str:
    """The dtype of a model's weights, as ``--precision`` names it in torch: "float32", "bfloat16"."""
    return str(next(model.parameters()).dtype).replace("torch.", "")
