"""What a training run shows while it runs: a bar over the optimizer steps with the loss, the last
evaluation's headline metric and the step rate.

The bar counts optimizer steps. Its total is ``--max-steps``, or the steps of ``--epochs`` (one epoch with no
limit at all); under a time budget it is the steps the budget leaves at the measured step rate when that is
fewer (``TimeBudget.steps_left``), re-estimated while the run goes, and the postfix shows the time spent of the
budget. The bar is drawn only on a terminal: ``--no-progress`` and a log file get one line per logged step.

The step rate is measured, never guessed: ``StepClock`` times each step (data, forward, backward, update;
evaluations and checkpoints are not steps) and leaves out the first ``WARMUP_STEPS`` of the process, which
measure GEMM engines and fill caches.

What the bar shows is steady: steps differ in length (batches are bucketed by length), so an estimate made
from the last steps' rate moves every step. The step total and the time left (the bar's ETA, computed from the
measured rate and the evaluations still to come, not tqdm's instantaneous rate) each go through a ``Steady``:
after ``STEADY_AFTER`` refreshes, a refresh moves them by at most ``STEADY_CHANGE`` of their value towards the
new estimate (the time left is first counted down by the time since the last refresh), so a lasting change
shows within a few refreshes and one odd batch does not.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Mapping, Sequence

import torch

__all__ = ["WARMUP_STEPS", "STEADY_AFTER", "STEADY_CHANGE", "StepClock", "Steady", "RunningLoss", "TrainBar",
           "headline", "bar_stream", "is_terminal"]

WARMUP_STEPS = 5     # steps of a process left out of its step rate
_RECENT_STEPS = 50   # the step rate follows about the last this many steps
_REFRESH_S = 0.5     # the postfix (which reads the loss from the device) is redrawn at most this often
STEADY_AFTER = 10    # refreshes during which the shown estimates follow the measured ones freely
STEADY_CHANGE = 0.02  # after them, the most a refresh moves a shown estimate, as a share of it


class StepClock:
    """Seconds per optimizer step, measured: after the warm-up, the mean of the steps so far, then a moving
    average of about the last 50 (a training step gets faster as caches fill and slower when others share the
    machine)."""

    def __init__(self) -> None:
        self.steps = 0            # steps timed in this process, warm-up included
        self.measured = 0         # of those, after the warm-up
        self.last: float | None = None
        self._mean: float | None = None

    def add(self, seconds: float) -> None:
        self.steps += 1
        self.last = seconds
        if self.steps <= WARMUP_STEPS:
            return
        self.measured += 1
        w = max(1.0 / self.measured, 1.0 / _RECENT_STEPS)
        self._mean = seconds if self._mean is None else (1 - w) * self._mean + w * seconds

    @property
    def step_s(self) -> float | None:
        """Seconds per step after the warm-up; during it, the last step's (None before any)."""
        return self._mean if self._mean is not None else self.last

    @property
    def steps_per_s(self) -> float | None:
        s = self.step_s
        return 1.0 / s if s else None


class Steady:
    """A shown estimate that moves smoothly: the first ``after`` updates take the new value as it is, later
    ones move at most ``change`` x the shown value (at least ``least``) towards it.

    ``update(target, expected=...)``: ``expected`` is where the shown value would be now if the last estimate
    held (the time left, counted down by the time since); it is the value the step is bounded around."""

    def __init__(self, *, change: float = STEADY_CHANGE, after: int = STEADY_AFTER, least: float = 0.0) -> None:
        self.change, self.after, self.least = change, after, least
        self.value: float | None = None
        self.updates = 0

    def update(self, target: float | None, *, expected: float | None = None) -> float | None:
        if target is None:
            return self.value
        self.updates += 1
        base = self.value if expected is None else expected
        if base is None or self.updates <= self.after:
            self.value = target
        else:
            room = max(self.change * abs(base), self.least)
            self.value = min(max(target, base - room), base + room)
        return self.value


class RunningLoss:
    """An exponential moving average of the training loss over about the last 50 steps, kept on the device
    (adding a step's loss does not make the host wait for the device; ``value`` does, so the bar reads it at
    most twice a second)."""

    def __init__(self, beta: float = 0.98) -> None:
        self.beta, self.steps = beta, 0
        self._avg: torch.Tensor | None = None

    def add(self, loss: torch.Tensor) -> None:
        loss = loss.detach().double()
        self._avg = loss.clone() if self._avg is None else self._avg * self.beta + loss * (1 - self.beta)
        self.steps += 1

    @property
    def value(self) -> float | None:
        return None if self._avg is None else float(self._avg)


def headline(metrics: Mapping[str, float], names: Sequence[str]) -> str:
    """The evaluation's headline metrics, ``names`` in order (those it has; without any of them, its first
    metric): ``"EM 14.2, F1 24.8"``."""
    shown = [k for k in names if k in metrics] or list(metrics)[:1]
    return ", ".join(f"{k} {metrics[k]:.4g}" for k in shown)


def bar_stream() -> IO[str]:
    """Where the bar is drawn (tests replace this to draw it into a buffer)."""
    return sys.stderr


def is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream: no bar
        return False


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


class TrainBar:
    """A tqdm bar over the optimizer steps: position = steps done, total = the run's steps (or the time
    budget's estimate, ``set_estimate``), postfix = smoothed loss, the last evaluation's headline metric with
    its step, the measured steps/s and, under a time budget, the time spent of it."""

    # The time left is ours (``Steady``), not tqdm's: "<eta>" is replaced by it at every refresh.
    _KNOWN = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps [{elapsed}<<eta>{postfix}]"
    _UNKNOWN = "{desc}: {n_fmt} steps [{elapsed}{postfix}]"

    def __init__(self, desc: str, *, total: int | None, initial: int = 0, metric_names: Sequence[str] = (),
                 budget_s: float | None = None, file: IO[str] | None = None, ncols: int | None = None,
                 clock=time.monotonic) -> None:
        from tqdm import tqdm  # the terminal's bar (a notebook's stderr is no terminal: it gets the log lines)

        self.fixed_total, self.metric_names, self.budget_s = total, tuple(metric_names), budget_s
        self.file = file or bar_stream()
        self.loss = RunningLoss()
        self.metric: str | None = None
        self._shown_at = -float("inf")
        self._status: tuple[float | None, float | None] = (None, None)
        self._clock = clock                      # the refresh clock (tests pass a simulated one)
        self.shown_total = Steady(least=1.0)     # the time budget's estimate of the run's steps, as shown
        self.shown_left = Steady(least=1.0)      # seconds left, as shown
        self._left_at: float | None = None       # when shown_left was last updated
        self.tqdm = tqdm(total=total, initial=initial, desc=desc, unit="step", file=self.file,
                         bar_format=self._format(total), dynamic_ncols=ncols is None, ncols=ncols,
                         mininterval=_REFRESH_S)

    def _format(self, total: int | None) -> str:
        if not total:
            return self._UNKNOWN
        left = self.shown_left.value
        return self._KNOWN.replace("<eta>", "?" if left is None else _clock(max(left, 0.0)))

    @property
    def n(self) -> int:
        return self.tqdm.n

    @property
    def total(self) -> int | None:
        return self.tqdm.total

    def set_estimate(self, steps: int | None, *, at_least: int = 0) -> None:
        """The time budget's estimate of the run's steps; the bar's total is the smaller of it and the fixed
        total (the limit that binds first), and never below ``at_least``."""
        total = self.fixed_total if steps is None else min(steps, self.fixed_total or steps)
        if total is not None:
            total = max(total, at_least)
        if total != self.tqdm.total:
            self.tqdm.total = total
        self.tqdm.bar_format = self._format(total)

    def evaluated(self, step: int, metrics: Mapping[str, float]) -> None:
        """An evaluation at ``step``: its headline metric joins the postfix, drawn now."""
        text = headline(metrics, self.metric_names)
        self.metric = f"{text} (step {step})" if text else None
        self.tqdm.set_postfix_str(self.postfix(*self._status))

    def postfix(self, steps_per_s: float | None = None, elapsed_s: float | None = None) -> str:
        parts = []
        loss = self.loss.value
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        if self.metric:
            parts.append(self.metric)
        if steps_per_s:
            parts.append(f"{steps_per_s:.3g} steps/s")
        if self.budget_s is not None and elapsed_s is not None:
            parts.append(f"{_clock(elapsed_s)} of {_clock(self.budget_s)}")
        return ", ".join(parts)

    def step(self, loss: torch.Tensor, *, steps_per_s: float | None, elapsed_s: float | None = None,
             estimate: int | None = None, left_s: float | None = None) -> None:
        """One more step done, with its loss (a device tensor), the measured step rate, the time spent of the
        budget, its estimate of the run's steps and the estimated seconds left (``left_s``); the postfix (one
        host read of the loss) and the estimates are renewed every half second, each through its ``Steady``."""
        self.loss.add(loss)
        self._status = (steps_per_s, elapsed_s)
        now = self._clock()
        if now - self._shown_at >= _REFRESH_S:
            self._shown_at = now
            if left_s is not None:
                since = 0.0 if self._left_at is None else now - self._left_at
                expected = None if self.shown_left.value is None else self.shown_left.value - since
                self.shown_left.update(left_s, expected=expected)
                self._left_at = now
            if self.budget_s is not None:
                shown = self.shown_total.update(None if estimate is None else float(estimate))
                self.set_estimate(None if shown is None else round(shown), at_least=self.tqdm.n + 1)
            else:
                self.tqdm.bar_format = self._format(self.tqdm.total)
            self.tqdm.set_postfix_str(self.postfix(steps_per_s, elapsed_s), refresh=False)
        elif self.budget_s is not None and self.tqdm.total is not None and self.tqdm.n >= self.tqdm.total:
            self.tqdm.total = self.tqdm.n + 1  # the estimate ran out between two renewals
        self.tqdm.update(1)

    def write(self, message: str) -> None:
        self.tqdm.write(message, file=self.file)

    def close(self, *, finished: bool = False) -> None:
        """``finished``: training is over (not interrupted), so the bar's total is the steps done."""
        if finished and self.tqdm.total != self.tqdm.n:
            self.tqdm.total = self.tqdm.n
        if finished:
            self.shown_left.value = 0.0
            self.tqdm.bar_format = self._format(self.tqdm.total)
        self.tqdm.close()
