"""A steady training display (fastqa.train.display.Steady): the step total and the time left move by at most a
few percent between refreshes once warmed up, however much the steps differ; a resumed run's time budget counts
the time spent before it; a run that evaluates every N steps shows a first evaluation early."""
from __future__ import annotations

import io
import json
import random
import re
from pathlib import Path

import pytest
import torch

from fastqa.errors import UserError
from fastqa.train import TrainSettings, fit
from fastqa.train.budget import TimeBudget
from fastqa.train.checkpoint import load_checkpoint
from fastqa.train.display import STEADY_AFTER, STEADY_CHANGE, StepClock, Steady, TrainBar
from fastqa.train.loop import _estimates
from toy_task import ToyTask


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_steady_follows_at_first_then_moves_a_bounded_share():
    s = Steady(change=0.02, after=2, least=1.0)
    assert s.update(None) is None
    assert s.update(100.0) == 100.0 and s.update(150.0) == 150.0          # the first ``after`` are taken as they are
    assert s.update(300.0) == pytest.approx(153.0)                         # then 2% a refresh
    assert s.update(0.0) == pytest.approx(153.0 * 0.98)
    assert s.update(150.0) == 150.0                                        # within reach: taken
    # ``expected``: where the value stands now (time left counted down); the step is bounded around it
    assert s.update(200.0, expected=100.0) == pytest.approx(102.0)
    assert s.update(0.2, expected=0.5) == 0.2                              # ``least``: at least one unit of room


def _simulate(seed: int, steps: int = 3000) -> tuple[list[float], list[float], list[float], list[float]]:
    """A one-hour budget run whose step times vary 4x (length buckets) with noise, shown through a TrainBar on
    a simulated clock; the loop's own estimates (``_estimates``) feed it. Returns (the raw step totals, the
    shown ones, the raw seconds left, the shown ones), one per refresh."""
    rng = random.Random(seed)
    now = 0.0
    bar = TrainBar("toy train", total=None, budget_s=3600.0, file=_Terminal(), ncols=120, clock=lambda: now)
    clock = StepClock()
    budget = TimeBudget(3600.0, examples_per_step=64, eval_examples=10_000, checkpoint_bytes=10**8)
    raw_total, shown_total, raw_left, shown_left = [], [], [], []
    for step in range(1, steps + 1):
        seconds = 2.7 * rng.choice([0.5, 1.0, 1.5, 2.0]) * rng.lognormvariate(0.0, 0.25)
        now += seconds
        clock.add(seconds)
        estimate, left = _estimates(step, None, clock, budget=budget, elapsed=now, evals_per_step=1 / 1000,
                                    eval_s=None)
        shown_at = bar._shown_at
        bar.step(torch.tensor(1.0), steps_per_s=clock.steps_per_s, elapsed_s=now, estimate=estimate, left_s=left)
        if bar._shown_at != shown_at and estimate is not None:   # a refresh with estimates
            raw_total.append(float(estimate))
            shown_total.append(float(bar.total))
            raw_left.append(left)
            shown_left.append(bar.shown_left.value)
        if estimate is not None and step >= estimate:
            break
    return raw_total, shown_total, raw_left, shown_left


@pytest.mark.parametrize("seed", [0, 1])
def test_step_total_and_time_left_are_steady_under_noisy_step_times(seed):
    raw_total, shown_total, raw_left, shown_left = _simulate(seed)
    assert len(shown_total) > 200
    warm = STEADY_AFTER + 1

    def jumps(values: list[float]) -> list[float]:
        return [abs(b - a) / a for a, b in zip(values[warm:], values[warm + 1:])]
    # The premise: the estimate made from the measured rate alone jumps by more than a few percent.
    assert max(jumps(raw_total)) > 2 * STEADY_CHANGE
    # What is shown moves by at most STEADY_CHANGE a refresh (and one step of rounding).
    for a, b in zip(shown_total[warm:], shown_total[warm + 1:]):
        assert abs(b - a) <= STEADY_CHANGE * a + 1, (a, b)
    # The time left: counted down by the time since the last refresh, then moved by at most STEADY_CHANGE.
    assert all(b <= a + STEADY_CHANGE * a + 1 for a, b in zip(shown_left[warm:], shown_left[warm + 1:]))
    # ... and it still tells the truth: the shown total stays near the estimate of the true mean rate.
    truth = sum(raw_total[-50:]) / 50
    assert abs(shown_total[-1] - truth) <= 0.05 * truth
    assert abs(shown_left[len(shown_left) // 2] - raw_left[len(raw_left) // 2]) <= 0.1 * raw_left[len(raw_left) // 2]


def test_the_bar_shows_its_own_time_left():
    now = 0.0
    bar = TrainBar("toy train", total=100, file=_Terminal(), ncols=120, clock=lambda: now)
    now = 1.0
    bar.step(torch.tensor(1.0), steps_per_s=1.0, left_s=125.0)
    assert "<2:05" in bar.tqdm.bar_format
    bar.close(finished=True)


def _settings(out, **kw) -> TrainSettings:
    base = dict(out_dir=str(out), clip_norm=5.0, eval_every=0, log_every=5, progress=False, save_every_minutes=None,
                eval_each_epoch=False)
    base.update(kw)
    return TrainSettings(**base)


def _rows(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_a_resumed_run_counts_the_time_already_spent(tmp_path, caplog):
    fit(ToyTask(delay=0.02), _settings(tmp_path, max_steps=10, max_minutes=1.0))
    spent = load_checkpoint(tmp_path)["elapsed_s"]
    assert spent >= 10 * 0.02
    # A budget the first part already spent: one line, nothing trained.
    with pytest.raises(UserError, match=r"already spent .* larger --max-minutes"):
        fit(ToyTask(delay=0.02), _settings(tmp_path, max_steps=20, max_minutes=spent / 60 / 2, resume=True))
    with caplog.at_level("INFO", logger="fastqa.train"):
        fit(ToyTask(delay=0.02), _settings(tmp_path, max_steps=20, max_minutes=1.0, resume=True))
    assert re.search(r"resumed .* at step 10 .*of the time budget already spent", caplog.text)
    # The resumed part's clock starts where the first part's stopped: its rows and its checkpoint go on from there.
    rows = [r for r in _rows(tmp_path, "train") if r["step"] > 10]
    assert rows and rows[0]["time"] >= spent
    assert load_checkpoint(tmp_path)["elapsed_s"] >= spent + 10 * 0.02


def test_a_first_evaluation_comes_early(tmp_path):
    # eval_every far beyond the run: without the early evaluation only the final one
    fit(ToyTask(delay=0.01), _settings(tmp_path / "off", max_steps=30, eval_every=1000, first_eval_minutes=None))
    assert [r["step"] for r in _rows(tmp_path / "off", "eval")] == [30]
    fit(ToyTask(delay=0.01), _settings(tmp_path / "on", max_steps=30, eval_every=1000, first_eval_minutes=0.002))
    steps = [r["step"] for r in _rows(tmp_path / "on", "eval")]
    assert len(steps) == 2 and 1 <= steps[0] < 30 and steps[1] == 30       # once, early, then the final one
    # Under a time budget, at most a tenth of it: 5 minutes of a 0.05-minute budget is 0.3 s.
    fit(ToyTask(delay=0.01), _settings(tmp_path / "budget", max_steps=2000, max_minutes=0.05, eval_every=1000))
    steps = [r["step"] for r in _rows(tmp_path / "budget", "eval")]
    assert len(steps) == 2 and steps[0] < steps[1]
    # No step-based evaluations asked for (eval_every 0): no early one either.
    fit(ToyTask(delay=0.01), _settings(tmp_path / "none", max_steps=30, first_eval_minutes=0.002))
    assert [r["step"] for r in _rows(tmp_path / "none", "eval")] == [30]
    with pytest.raises(UserError, match="first_eval_minutes"):
        _settings(tmp_path, first_eval_minutes=-1.0)
