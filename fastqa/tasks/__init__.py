"""The tasks fastqa trains and serves, one folder each, every folder of the same kinds of module:
its data, its metric, its training task for ``fastqa.train.fit``, its predictor, its command and its spec.

    fastqa/tasks/qa/            readers on SQuAD: ``QAModel``, ``fastqa qa-train | qa-predict | qa-eval | ask``
    fastqa/tasks/translation/   ConvS2S on parallel text: ``Translator``, ``fastqa mt-train | translate | mt-eval``

Each folder's ``spec.py`` holds its ``TaskSpec`` (``fastqa.tasks.spec``): the command line, ``fastqa serve``,
the shipped models' listing and the trainer's expectation line loop over ``TASKS`` and name no task. Adding a
task is one folder (with its spec) and one line in ``TASKS``; ``add_task`` registers one from elsewhere (a
plug-in, a test) for the process.
"""
from __future__ import annotations

import base64
import pickle

from .qa.spec import SPEC as _QA
from .spec import TaskSpec
from .translation.spec import SPEC as _TRANSLATION

__all__ = ["TASKS", "TaskSpec", "add_task", "added_tasks", "add_tasks_of", "task_of"]

#: every task, in the order ``fastqa --help`` lists their commands and ``fastqa serve`` their flags and routes
TASKS: list[TaskSpec] = [_QA, _TRANSLATION]
_BUILT_IN = len(TASKS)  # those after them add_task registered


def add_task(spec: TaskSpec) -> None:
    """Register ``spec`` after the built-in tasks, for this process: its commands, its route of ``fastqa serve``
    and its shipped model join theirs. A name, a kind, a flag or a route already taken is a ValueError."""
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
    for other in TASKS:
        if other.name == spec.name:
            raise ValueError(f"spec: a task named {spec.name!r} is registered already")
        taken = set(other.kinds) & set(spec.kinds)
        if taken:
            raise ValueError(f"spec: the kind {sorted(taken)[0]!r} is the {other.name} task's")
        if spec.serve_flag is not None and spec.serve_flag == other.serve_flag:
            raise ValueError(f"spec: the flag {spec.serve_flag} is the {other.name} task's")
    TASKS.append(spec)


def added_tasks() -> str:
    """The tasks ``add_task`` registered in this process, as text for ``add_tasks_of`` in another process:
    ``fastqa serve --workers N`` hands them to its worker processes, which start with the built-in tasks only.
    (A spec names its modules and objects by import path, so the text carries no code.)"""
    return base64.b64encode(pickle.dumps(TASKS[_BUILT_IN:])).decode("ascii")


def add_tasks_of(text: str) -> None:
    """Register the tasks of ``added_tasks()``'s text from another process, those not registered here yet."""
    for spec in pickle.loads(base64.b64decode(text)):
        if all(spec.name != task.name for task in TASKS):
            add_task(spec)


def task_of(name: str, kind: str | None) -> str | None:
    """The task of a shipped model: the task that ships ``name``, else the one whose predictor reads ``kind``."""
    for spec in TASKS:
        if spec.shipped == name:
            return spec.name
    return next((spec.name for spec in TASKS if kind in spec.kinds), None)
