"""The shared training loop on a toy task: exact resume, torchrun/DDP equivalence, checkpoints, logs."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastqa.errors import UserError
from fastqa._backend import cpu_gemm_plan
from fastqa.train import TrainSettings, fit, load_checkpoint, save_checkpoint
from fastqa.data.files import atomic_write_text
from toy_task import ToyTask

TESTS = Path(__file__).resolve().parents[1]


def _settings(out, **kw) -> TrainSettings:
    base = dict(out_dir=str(out), clip_norm=5.0, ema_decay=0.99, eval_every=5, log_every=1, progress=False)
    base.update(kw)
    return TrainSettings(**base)


def _train_losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def test_fit_writes_run_folder_and_loss_falls(tmp_path):
    result = fit(ToyTask(), _settings(tmp_path, max_steps=60))
    assert result["step"] == 60 and "dev_loss" in result
    losses = _train_losses(tmp_path)
    assert sorted(losses) == list(range(1, 61))
    assert sum(list(losses.values())[-10:]) < sum(list(losses.values())[:10])
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    payload = load_checkpoint(tmp_path)
    assert payload["kind"] == "toy" and payload["step"] == 60 and payload["ema"] is not None
    # The GEMM engine's decisions travel with the run (a resumed process restores them: same rounding).
    assert payload["gemm_plan"]["cpu_gemm"] == cpu_gemm_plan()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("stop_at", [7, 12])  # 12 = the end of an epoch (96 / 8 batches)
def test_resume_reproduces_uninterrupted_losses_bit_for_bit(tmp_path, stop_at):
    fit(ToyTask(), _settings(tmp_path / "full", max_steps=30))
    fit(ToyTask(), _settings(tmp_path / "split", max_steps=stop_at))
    fit(ToyTask(), _settings(tmp_path / "split", max_steps=30, resume=True))
    assert _train_losses(tmp_path / "split") == _train_losses(tmp_path / "full")
    full, split = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "split")
    for k, v in full["model"].items():
        assert torch.equal(v, split["model"][k]), k
    for k, v in full["ema"].items():
        assert torch.equal(v, split["ema"][k]), k


def test_epochs_limit_and_eval_each_epoch(tmp_path):
    result = fit(ToyTask(), _settings(tmp_path, epochs=2, eval_every=0))
    assert result["step"] == 24
    evals = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    assert [e["step"] for e in evals] == [12, 24]


def test_time_budget_alone_runs_past_one_epoch(tmp_path):
    # 3 s: more than one epoch of 12 tiny batches even on a busy machine (its steps take milliseconds).
    result = fit(ToyTask(), _settings(tmp_path, max_minutes=0.05, eval_every=0, eval_each_epoch=False))
    assert result["step"] > 12


def test_refuses_to_overwrite_and_to_resume_another_model(tmp_path):
    fit(ToyTask(), _settings(tmp_path, max_steps=2))
    with pytest.raises(UserError, match="--resume"):
        fit(ToyTask(), _settings(tmp_path, max_steps=4))
    with pytest.raises(UserError, match="another config"):
        fit(ToyTask(hidden=8), _settings(tmp_path, max_steps=4, resume=True))
    with pytest.raises(UserError, match="no such checkpoint"):
        fit(ToyTask(), _settings(tmp_path / "empty", max_steps=4, resume=True))


def test_checkpoint_errors_and_atomic_writes(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="junk.pt"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a fastqa checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    atomic_write_text(tmp_path / "a.txt", "first")
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600

    class Boom(Exception):
        pass

    class Unpicklable:
        def __reduce__(self):
            raise Boom()

    save_checkpoint(tmp_path, {"step": 1})
    with pytest.raises(Boom):
        save_checkpoint(tmp_path, {"step": 2, "bad": Unpicklable()})
    assert load_checkpoint(tmp_path)["step"] == 1  # the old checkpoint survives a failed write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "checkpoint.pt", "junk.pt", "other.pt"]


def test_torchrun_two_gloo_processes_equal_one_process(tmp_path):
    """DDP over 2 CPU processes, each on half of every global batch, ends with the weights of 1 process
    on the whole batch (fp32 reduction order aside)."""
    steps = 8
    fit(ToyTask(dropout=0.0), _settings(tmp_path / "one", max_steps=steps, eval_every=0))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(TESTS / "toy_task.py"), str(tmp_path / "two"), str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "two")
    assert two["step"] == steps and len(two["rng"]) == 2
    for k, v in one["model"].items():
        torch.testing.assert_close(two["model"][k], v, atol=1e-5, rtol=1e-5, msg=k)
    assert not torch.equal(one["model"]["0.weight"], ToyTask(dropout=0.0).model[0].weight)  # it trained


def test_ema_averages_trained_weights_and_skips_frozen_ones():
    from torch import nn

    from fastqa.train import EMA

    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    ema = EMA(model, decay=0.5)
    with torch.no_grad():
        model.weight.add_(1.0)
        model.bias.add_(1.0)  # a frozen parameter changed behind the EMA's back stays as it was kept
    before = ema.shadow["weight"].clone()
    ema.update(model)
    d = min(0.5, 2 / 11)
    torch.testing.assert_close(ema.shadow["weight"], d * before + (1 - d) * model.weight.detach())
    assert not torch.equal(ema.shadow["bias"], model.bias.detach())
    bias = model.bias.detach().clone()
    with ema.swapped_in(model):
        assert torch.equal(model.weight, ema.shadow["weight"])
        assert torch.equal(model.bias, bias)   # a frozen parameter is never swapped (its shadow differs here)
    assert not torch.equal(model.weight, ema.shadow["weight"])


def test_a_non_finite_loss_stops_before_anything_is_saved(tmp_path):
    # The losses stay on the device between log rows (no host sync per step); a NaN is caught at the next
    # read, and a checkpoint due in between refuses the spoilt weights.
    class Exploding(ToyTask):
        def loss(self, model, batch):
            loss = super().loss(model, batch)
            self.calls = getattr(self, "calls", 0) + 1
            return loss * float("nan") if self.calls == 7 else loss

    with pytest.raises(FloatingPointError, match="between steps 6 and 8"):
        fit(Exploding(), _settings(tmp_path, max_steps=30, log_every=5, eval_every=8))
    assert not (tmp_path / "checkpoint.pt").exists()


def test_without_a_bar_each_logged_step_is_a_log_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="fastqa"):
        fit(ToyTask(), _settings(tmp_path, max_steps=10, log_every=5, eval_every=0))
    lines = [r.getMessage() for r in caplog.records if "steps/s" in r.getMessage()]
    assert [ln.split(",")[0] for ln in lines] == ["step 5/10", "step 10/10"], lines
    assert all("loss" in ln and "steps/s" in ln and "elapsed" in ln for ln in lines)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_training_scales_the_loss_and_resumes_its_scaler(tmp_path):
    fit(ToyTask(), _settings(tmp_path, max_steps=6, amp="fp16", device="cuda"))
    payload = load_checkpoint(tmp_path)
    assert payload["grad_scaler"] is not None and payload["grad_scaler"]["scale"] > 0
    fit(ToyTask(), _settings(tmp_path, max_steps=8, amp="fp16", device="cuda", resume=True))


def test_no_grad_scaler_state_outside_fp16(tmp_path):
    fit(ToyTask(), _settings(tmp_path, max_steps=2))
    assert load_checkpoint(tmp_path)["grad_scaler"] is None
