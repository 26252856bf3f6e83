"""What a training run shows (fastqa.train.display, .budget, .expectations): the bar over the optimizer steps
with the loss, the headline metric and the step rate; the time budget that holds the final evaluation and
checkpoint; the one line of what to expect."""
from __future__ import annotations

import io
import json
import logging
import re
import time
from pathlib import Path

import pytest
import torch

from fastqa.train import TrainSettings, fit
from fastqa.train import display, loop
from fastqa.train.budget import CURVE_S, TimeBudget
from fastqa.train.display import WARMUP_STEPS, StepClock, TrainBar, headline
from fastqa.tasks import TASKS
from fastqa.train.expectations import EXPECTATION_STEP, expectation_line
from toy_task import ToyTask

DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Scored(ToyTask):
    """The toy task with a headline metric, a command and a preset, as the real tasks have."""

    command, preset, headline_metrics = "toy-train", "small", ("score",)

    def evaluate(self, model):
        metrics = super().evaluate(model)
        return {**metrics, "score": 1.0 - metrics["dev_loss"]}


@pytest.fixture()
def bars(monkeypatch):
    """Draw the loop's bars into a buffer that says it is a terminal; yields (buffer, the bars made)."""
    screen, made = _Terminal(), []

    class Recorded(TrainBar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(display, "bar_stream", lambda: screen)
    monkeypatch.setattr(loop, "TrainBar", Recorded)
    return screen, made


def _settings(out, **kw) -> TrainSettings:
    base = dict(out_dir=str(out), clip_norm=5.0, eval_every=5, log_every=5, progress=True, save_every_minutes=None)
    base.update(kw)
    return TrainSettings(**base)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# -- the bar ---------------------------------------------------------------------------------------------------

def test_bar_counts_steps_and_shows_loss_metric_and_rate(tmp_path, bars):
    screen, made = bars
    fit(_Scored(), _settings(tmp_path, max_steps=10))
    (bar,) = made
    assert (bar.n, bar.total) == (10, 10)
    postfix = bar.tqdm.postfix
    assert re.search(r"loss \d", postfix) and "steps/s" in postfix
    assert "score " in postfix and "(step 10)" in postfix  # the last evaluation's headline metric, with its step
    assert "dev_loss" not in postfix                         # only the headline
    assert "10/10 steps" in screen.getvalue()


def test_bar_total_is_the_epochs_steps(tmp_path, bars):
    _, made = bars
    fit(ToyTask(), _settings(tmp_path / "two", epochs=2, eval_every=0))
    fit(ToyTask(), _settings(tmp_path / "none", eval_every=0))  # no limit at all: one epoch
    assert [(b.n, b.total) for b in made] == [(24, 24), (12, 12)]  # 96 examples in batches of 8


def test_bar_under_a_time_budget_estimates_its_total_and_shows_the_budget(tmp_path, bars):
    screen, made = bars
    fit(_Scored(delay=0.003), _settings(tmp_path, max_minutes=0.03, eval_every=0, eval_each_epoch=False))
    (bar,) = made
    assert bar.n > 0 and bar.total == bar.n  # at the end the total is the steps done
    assert bar.tqdm.postfix.endswith("of 0:01") and "score" in bar.tqdm.postfix
    # the expectation line, written above the bar, says what the budget leaves
    assert re.search(r"toy-train: small preset, .*budget leaves about [\d,]+ steps", screen.getvalue())


def test_train_bar_total_and_postfix():
    bar = TrainBar("toy train", total=None, budget_s=180, file=_Terminal(), ncols=120)
    assert bar.total is None
    bar.step(torch.tensor(2.5), steps_per_s=1.5, elapsed_s=61, estimate=300)
    assert (bar.n, bar.total) == (1, 300)
    assert bar.postfix(1.5, 61) == "loss 2.5, 1.5 steps/s, 1:01 of 3:00"
    bar.evaluated(1, {"dev_loss": 1.0, "EM": 14.16, "F1": 24.83})  # no headline names: the first metric
    assert "dev_loss 1 (step 1)" in bar.tqdm.postfix
    bar.set_estimate(250)
    assert bar.total == 250
    bar.close(finished=True)
    assert bar.total == 1
    fixed = TrainBar("toy train", total=100, budget_s=180, file=_Terminal())
    fixed.set_estimate(250)
    assert fixed.total == 100  # the step limit binds first
    fixed.set_estimate(40)
    assert fixed.total == 40   # the budget binds first
    fixed.close()


def test_headline_and_step_clock():
    metrics = {"dev_loss": 5.9, "EM": 23.788, "F1": 35.838}
    assert headline(metrics, ("EM", "F1")) == "EM 23.79, F1 35.84"
    assert headline({"val_loss": 2.2, "val_ppl": 9.07}, ("val_bleu",)) == "val_loss 2.2"
    clock = StepClock()
    assert clock.step_s is None
    for _ in range(WARMUP_STEPS):
        clock.add(3.0)  # warm-up steps: not in the rate
    assert clock.measured == 0 and clock.step_s == 3.0
    for s in (0.4, 0.6):
        clock.add(s)
    assert clock.measured == 2 and clock.step_s == pytest.approx(0.5) and clock.steps_per_s == pytest.approx(2.0)


def test_without_a_terminal_each_logged_step_is_a_log_line(tmp_path, monkeypatch, caplog):
    log_file = io.StringIO()
    monkeypatch.setattr(display, "bar_stream", lambda: log_file)
    with caplog.at_level(logging.INFO, logger="fastqa"):
        fit(ToyTask(), _settings(tmp_path, max_steps=10, eval_every=0))
    assert log_file.getvalue() == ""
    assert [m.split(",")[0] for m in caplog.messages if "steps/s" in m] == ["step 5/10", "step 10/10"]


# -- the time budget --------------------------------------------------------------------------------------------

def test_budget_rule_reserves_the_final_evaluation():
    budget = TimeBudget(60.0)
    budget.record_evaluation(8.0)
    budget.record_evaluation(6.0)  # the longest so far counts
    assert budget.reserve(1.0) == 8.0
    assert not budget.must_stop(50.9, 1.0) and budget.must_stop(51.0, 1.0)  # 51 + a step + 8 = the budget
    # An evaluation due here counts twice: its own and the final one.
    assert not budget.must_stop(42.9, 1.0, eval_due=True) and budget.must_stop(43.0, 1.0, eval_due=True)
    budget.record_checkpoint(2.0)
    assert budget.must_stop(49.0, 1.0, save_due=True) and not budget.must_stop(48.9, 1.0, save_due=True)


def test_budget_estimates_an_evaluation_before_one_is_timed():
    budget = TimeBudget(180.0, examples_per_step=32, eval_examples=1600, checkpoint_bytes=50_000_000)
    # 1,600 examples = 50 steps' examples, at half a training example's time: 12.5 s at 0.5 s a step; the
    # checkpoint's bytes at 100 MB/s; the curve.
    assert budget.reserve(0.5) == pytest.approx(12.5 + 0.5 + CURVE_S)
    assert budget.reserve(None) == pytest.approx(0.5 + CURVE_S)  # no step timed: no rate to scale
    budget.record_checkpoint(2.0)
    assert budget.reserve(0.5) == pytest.approx(12.5 + 2.0 + CURVE_S)
    budget.record_evaluation(9.0)
    assert budget.reserve(0.5) == 9.0 and budget.measured
    assert TimeBudget(60.0).reserve(0.5) == CURVE_S  # a task that does not say its evaluation's size


def test_budget_steps_left_agrees_with_the_rule():
    budget = TimeBudget(100.0)
    budget.record_evaluation(7.0)
    elapsed, steps = 10.0, 0
    while not budget.must_stop(elapsed, 0.75):
        elapsed += 0.75
        steps += 1
    assert budget.steps_left(10.0, 0.75) == steps
    assert budget.steps_left(10.0, None) is None
    # with an evaluation every 10 steps on the way, fewer
    assert budget.steps_left(10.0, 0.75, evals_per_step=0.1) < steps


class _SlowEval(ToyTask):
    """The toy task whose evaluation takes ``eval_s`` seconds at the least."""

    def __init__(self, eval_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.eval_s = eval_s

    def evaluate(self, model):
        time.sleep(self.eval_s)
        return super().evaluate(model)


def test_time_budget_holds_the_final_evaluation_and_checkpoint(tmp_path, caplog):
    budget_s, eval_s = 0.05 * 60, 0.5
    # A process's first optimizer imports torch._dynamo and its first curve matplotlib (seconds): done here,
    # not inside this short budget, when the test runs alone.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    import matplotlib.pyplot  # noqa: F401
    with caplog.at_level(logging.INFO, logger="fastqa"):
        result = fit(_SlowEval(eval_s, delay=0.01), _settings(tmp_path, max_minutes=0.05, eval_every=10,
                                                              eval_each_epoch=False, log_every=1, progress=False))
    rows = _rows(tmp_path)
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert result["step"] > 10 and len(evals) >= 2  # an evaluation was timed before the end
    # The decision: the last step began at a boundary where one step and the final evaluation (at least its
    # 0.5 s) still fitted in the budget -- so before the budget less the evaluation's time.
    assert train[-2]["time"] <= budget_s - eval_s
    # The whole run, final evaluation and checkpoint included, ends inside the budget (without the rule it ends
    # about 0.5 s after it; the slack is for a busy machine).
    assert evals[-1]["time"] <= budget_s + 0.3
    assert any(m.startswith("time budget: training stops at") for m in caplog.messages)


# -- what to expect ---------------------------------------------------------------------------------------------

def _reference(kind: str, preset: str):
    """The documented run of (kind, preset), from the task that trains that kind."""
    return next(t.reference_run(kind, preset) for t in TASKS if kind in t.kinds)


def test_expectation_line_cites_the_documented_run():
    line = expectation_line("qa-train", "qanet", preset="small", where="2 threads", steps_per_minute=95.4,
                            reference=_reference("qanet", "small"), budget_minutes=3, budget_steps=250)
    assert line.startswith("qa-train: small preset, 2 threads: about 95 steps/min here after warm-up; ")
    assert "F1 ~53 (EM 40) on SQuAD v1.1 dev articles 40-47 after 4,500 steps (40 min at 112 steps/min" in line
    assert "(docs/models.md)" in line and line.endswith("the 3-minute budget leaves about 250 steps")
    assert "\n" not in line
    mt = expectation_line("mt-train", "convs2s", preset="small", where="1 thread", steps_per_minute=None,
                          reference=_reference("convs2s", "small"), steps_timed=3)
    assert "no step rate yet (3 steps run); the documented run made 74 steps/min" in mt and "sacreBLEU ~40" in mt
    assert _reference("qanet", "paper") is None
    other = expectation_line("qa-train", "qanet", preset="paper", where="cuda (GPU)", steps_per_minute=600,
                             reference=_reference("qanet", "paper"))
    assert "about 600 steps/min" in other and "documents no run of qanet paper preset" in other


def test_reference_runs_are_the_documented_figures():
    docs = " ".join(DOCS.read_text(encoding="utf-8").replace("`", "").split())
    assert "after 40 minutes" in docs and "EM 40.21 / F1 52.74" in docs and "88 min, 6,501 steps" in docs
    assert "sacreBLEU **40.07**" in docs
    runs = [ref for task in TASKS for ref in task.reference_runs.values()]
    assert len(runs) == 2
    for ref in runs:
        assert f"{ref.steps:,} steps" in docs and f"{ref.minutes:g} min" in docs
        assert ref.early in docs  # the early figures are in the docs too


def test_the_expectation_line_comes_once_after_the_warm_up(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="fastqa"):
        fit(_Scored(), _settings(tmp_path / "long", max_steps=30, log_every=1, eval_every=0, progress=False))
    messages = caplog.messages
    lines = [i for i, m in enumerate(messages) if m.startswith("toy-train: ")]
    assert len(lines) == 1
    step = {int(m.split()[1].split("/")[0]): i for i, m in enumerate(messages) if m.startswith("step ") and "/" in m}
    assert step[EXPECTATION_STEP - 1] < lines[0] < step[EXPECTATION_STEP + 1]
    assert re.search(r"^toy-train: small preset, (\d+ threads?|.*): about [\d,]+ steps/min here after warm-up; "
                     r"docs/models.md documents no run", messages[lines[0]])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastqa"):  # a shorter run: the line before its final evaluation
        fit(_Scored(), _settings(tmp_path / "short", max_steps=8, eval_every=0, progress=False))
    said = [m for m in caplog.messages if m.startswith("toy-train: ")]
    assert len(said) == 1 and "steps/min here after warm-up" in said[0]


def test_the_qa_task_says_its_command_preset_metrics_and_evaluation_size(tmp_path):
    from squad_fixtures import make_squad
    from fastqa.tasks.qa.task import QATask

    data = str(tmp_path / "squad.json")
    make_squad(data, articles=1, paragraphs=2, people=2, seed=1)
    task = QATask.from_files(data, data, preset="small", cache_dir=None, progress=False,
                             overrides={"d_model": 16, "heads": 2, "char_dim": 8, "char_channels": 16})
    assert (task.command, task.preset, task.headline_metrics) == ("qa-train", "small", ("EM", "F1"))
    assert task.reference_run is not None and task.reference_run.steps == 4500  # its spec's documented run
    assert task.eval_size == len(task.dev_data) > 0
