"""The time budget (``--max-minutes``) holds the whole run: the final evaluation and checkpoint fit in it.

The rule, checked at every step boundary: training stops at the first boundary where

    elapsed + one step + reserve >= budget

``one step`` is the measured time of a step (``StepClock``). ``reserve`` is what the end of the run takes:
the longest evaluation-and-checkpoint measured so far (evaluation, checkpoint, metrics row and curve, as
``fit`` does them at every evaluation); before the first one, an estimate: the evaluation's examples
(``Task.eval_size``) at half a training example's time each (a forward pass alone is about a third of a
training step; the rest is room for decoding and scoring), plus the longest checkpoint so far or else the
checkpoint's bytes at 100 MB/s, plus a second for the curve (the first imports matplotlib). An evaluation due at that boundary (every
``eval_every`` steps, at an epoch's end) counts twice, its own and the final one: when the two do not fit,
training stops there and that evaluation is the final one. A time-based checkpoint due there adds the longest
checkpoint so far. The loop also measures every evaluation, so an estimate is used only until the first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TimeBudget", "EVAL_EXAMPLE_SHARE", "WRITE_BYTES_PER_S", "CURVE_S"]

EVAL_EXAMPLE_SHARE = 0.5   # an evaluation example's time, as a share of a training example's
WRITE_BYTES_PER_S = 100e6  # a checkpoint's bytes written (pickled, hashed, fsynced) per second, before one is timed
CURVE_S = 1.0              # drawing curve.png (the first one imports matplotlib), before an evaluation is timed


@dataclass
class TimeBudget:
    """The budget of a run and what the end of it needs (see the module's docstring for the rule).

    seconds: the budget; examples_per_step: a training step's examples (the global batch); eval_examples:
    the examples an evaluation reads (``Task.eval_size``; None: not known, nothing reserved for it until an
    evaluation is timed); checkpoint_bytes: the estimated size of a checkpoint."""

    seconds: float
    examples_per_step: float = 1.0
    eval_examples: float | None = None
    checkpoint_bytes: int = 0
    eval_cost: float | None = None   # the longest evaluation-and-checkpoint so far, seconds
    save_cost: float | None = None   # the longest checkpoint so far, seconds

    def record_evaluation(self, seconds: float) -> None:
        self.eval_cost = seconds if self.eval_cost is None else max(self.eval_cost, seconds)

    def record_checkpoint(self, seconds: float) -> None:
        self.save_cost = seconds if self.save_cost is None else max(self.save_cost, seconds)

    @property
    def measured(self) -> bool:
        """Whether the reserve is a measured evaluation rather than an estimate."""
        return self.eval_cost is not None

    def checkpoint_seconds(self) -> float:
        return self.save_cost if self.save_cost is not None else self.checkpoint_bytes / WRITE_BYTES_PER_S

    def reserve(self, step_s: float | None) -> float:
        """Seconds the final evaluation and checkpoint need."""
        if self.eval_cost is not None:
            return self.eval_cost
        evaluation = 0.0
        if self.eval_examples and step_s:
            evaluation = self.eval_examples / max(self.examples_per_step, 1e-9) * step_s * EVAL_EXAMPLE_SHARE
        return evaluation + self.checkpoint_seconds() + CURVE_S

    def needed(self, step_s: float | None, *, eval_due: bool = False, save_due: bool = False) -> float:
        """Seconds the run still needs past this boundary at the least: one step, the final evaluation and
        checkpoint, and what is due here."""
        reserve = self.reserve(step_s)
        return ((step_s or 0.0) + reserve + (reserve if eval_due else 0.0)
                + (self.checkpoint_seconds() if save_due else 0.0))

    def must_stop(self, elapsed: float, step_s: float | None, *, eval_due: bool = False,
                  save_due: bool = False) -> bool:
        """The rule: stop training here when the next step and the end of the run would not fit."""
        return elapsed + self.needed(step_s, eval_due=eval_due, save_due=save_due) >= self.seconds

    def steps_left(self, elapsed: float, step_s: float | None, *, evals_per_step: float = 0.0) -> int | None:
        """Steps the budget still leaves at ``step_s`` (None before a step is timed); ``evals_per_step``:
        evaluations per step on the way (1 / eval_every, plus 1 / steps per epoch with an evaluation at every
        epoch's end), each costing the reserve."""
        if not step_s:
            return None
        reserve = self.reserve(step_s)
        left = self.seconds - elapsed - reserve
        return max(0, math.floor(left / (step_s + reserve * evals_per_step)))
