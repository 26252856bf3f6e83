"""What to expect of a training run: the one line ``fit`` prints once the step rate is measured.

    qa-train: small preset, 2 threads: about 95 steps/min here after warm-up; the recipe reaches F1 ~53
    (EM 40) on SQuAD v1.1 dev articles 40-47 after 4,500 steps (40 min at 112 steps/min on one AMD EPYC
    thread), F1 ~25 after 500 steps and ~36 after 1,000 (docs/models.md); at this rate the 3-minute budget
    leaves about 250 steps

The trainer knows no model: the figures of the documented runs are the tasks' (each ``TaskSpec``'s
``reference_runs``, ``fastqa.tasks.spec``), and a task hands its run's to the loop as ``reference_run``. A
model and preset without a documented run gets the first part.
"""
from __future__ import annotations

from typing import Protocol

__all__ = ["DocumentedRun", "EXPECTATION_STEP", "expectation_line"]

EXPECTATION_STEP = 20  # the line comes after this many steps of the process (the first ones are warm-up)


class DocumentedRun(Protocol):
    """What the line quotes of a documented run of a recipe (a task's ``ReferenceRun``, ``fastqa.tasks.spec``)."""

    result: str
    steps: int
    minutes: float
    machine: str
    early: str
    source: str

    @property
    def steps_per_minute(self) -> float: ...


def expectation_line(command: str, model: str, *, preset: str | None, where: str, steps_per_minute: float | None,
                     reference: DocumentedRun | None = None, steps_timed: int = 0,
                     budget_minutes: float | None = None, budget_steps: int | None = None) -> str:
    """The line: ``command``; ``model`` (the task's kind) and ``preset`` (None: not known) name the recipe,
    ``reference`` its documented run (the task's ``reference_run``; None: none); ``where``: "2 threads",
    "cuda (NVIDIA H100)"...; ``steps_per_minute``: measured here after the warm-up (None: not yet,
    ``steps_timed`` steps run); ``budget_steps``: the steps the time budget leaves in all at that rate."""
    ref = reference
    who = f"{preset} preset" if preset is not None else model
    if steps_per_minute:
        rate = f"about {steps_per_minute:,.0f} steps/min here after warm-up"
    else:
        rate = f"no step rate yet ({steps_timed} steps run)"
        if ref is not None:
            rate += f"; the documented run made {ref.steps_per_minute:,.0f} steps/min"
    if ref is not None:
        about = (f"the recipe reaches {ref.result} after {ref.steps:,} steps ({ref.minutes:g} min at "
                 f"{ref.steps_per_minute:,.0f} steps/min on {ref.machine}), {ref.early} ({ref.source})")
    else:
        about = f"docs/models.md documents no run of {model} {who} to compare with"
    line = f"{command}: {who}, {where}: {rate}; {about}"
    if budget_minutes is not None and budget_steps is not None:
        line += f"; at this rate the {budget_minutes:g}-minute budget leaves about {budget_steps:,} steps"
    return line
