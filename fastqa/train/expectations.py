"""What to expect of a training run: the one line ``fit`` prints once the step rate is measured.

    qa-train: small preset, 2 threads: about 95 steps/min here after warm-up; the recipe reaches F1 ~53
    (EM 40) on SQuAD v1.1 dev articles 40-47 after 4,500 steps (40 min at 112 steps/min on one AMD EPYC
    thread), F1 ~25 after 500 steps and ~36 after 1,000 (docs/models.md); at this rate the 3-minute budget
    leaves about 250 steps

The figures of the documented runs live in ``REFERENCE_RUNS`` below and nowhere else in the code; each
entry says where its figures come from. A model and preset without a documented run gets the first part.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReferenceRun", "REFERENCE_RUNS", "EXPECTATION_STEP", "expectation_line"]

EXPECTATION_STEP = 20  # the line comes after this many steps of the process (the first ones are warm-up)


@dataclass(frozen=True)
class ReferenceRun:
    """A documented run of a recipe: what it reached, after how many steps and minutes, on what machine,
    and what its evaluations read early on (``early``)."""

    result: str
    steps: int
    minutes: float
    machine: str
    early: str
    source: str = "docs/models.md"

    @property
    def steps_per_minute(self) -> float:
        return self.steps / self.minutes


# (task kind, preset) -> its documented run.
REFERENCE_RUNS: dict[tuple[str, str], ReferenceRun] = {
    # The QANet recipe of the README (articles 0:40): docs/models.md, "Real-data results", the run of record
    # docs/runs/qanet-small-v11-match (its best evaluation: EM 40.21 / F1 52.74 on articles 40-47 at step 4,500,
    # after 40 minutes on one AMD EPYC thread; F1 24.83 at step 500, 35.84 at step 1,000).
    ("qanet", "small"): ReferenceRun(
        result="F1 ~53 (EM 40) on SQuAD v1.1 dev articles 40-47", steps=4500, minutes=40,
        machine="one AMD EPYC thread", early="F1 ~25 after 500 steps and ~36 after 1,000"),
    # The shipped translator convs2s-small-multi30k: docs/models.md, "Real-data results" (the default subword
    # vocabulary, 88 min, 6,501 steps: sacreBLEU 40.07 on test_2016_flickr, beam 5); the machine from
    # docs/runs/convs2s-small-multi30k-subword/README.md. The early points: that run's metrics.jsonl, --valid-bleu 200
    # (greedy tokenized BLEU 27.38 at step 500, 34.43 at step 1,000).
    ("convs2s", "small"): ReferenceRun(
        result="sacreBLEU ~40 on Multi30k de-en test_2016_flickr (beam 5, subword vocabulary)", steps=6501,
        minutes=88, machine="one Intel Xeon thread",
        early="--valid-bleu 200 reads BLEU ~27 after 500 steps and ~34 after 1,000"),
}


def expectation_line(command: str, model: str, *, preset: str | None, where: str, steps_per_minute: float | None,
                     steps_timed: int = 0, budget_minutes: float | None = None,
                     budget_steps: int | None = None) -> str:
    """The line: ``command``; ``model`` (the task's kind) and ``preset`` (None: not known) pick the
    documented run; ``where``: "2 threads", "cuda (NVIDIA H100)"...; ``steps_per_minute``: measured here
    after the warm-up (None: not yet, ``steps_timed`` steps run); ``budget_steps``: the steps the time
    budget leaves in all at that rate."""
    ref = REFERENCE_RUNS.get((model, preset)) if preset is not None else None
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
