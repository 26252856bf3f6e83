"""No lost training, guarded run folders: SIGINT/SIGTERM checkpoint then exit and resume bit-identically,
time-based checkpoints, the run-folder lock, checksummed checkpoints, a torn metrics line, stale
temporaries of an interrupted write."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastqa.errors import UserError
from fastqa.train import TrainingInterrupted, TrainSettings, fit, load_checkpoint, save_checkpoint
from fastqa.train import loop
from fastqa.data.metrics import read_metrics
from fastqa.train.interrupt import StopSignals
from fastqa.train.run_folder import RunFolderLock
from toy_task import ToyTask

TESTS = Path(__file__).resolve().parents[1]
STEPS = 40


def _settings(out, **kw) -> TrainSettings:
    # What tests/toy_task.py's script trains with, so in-process and subprocess runs compare.
    base = dict(out_dir=str(out), clip_norm=5.0, ema_decay=0.99, eval_every=0, log_every=1, progress=False)
    base.update(kw)
    return TrainSettings(**base)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"}


def _start(out: Path, steps: int = STEPS, delay: float = 0.1) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, str(TESTS / "toy_task.py"), str(out), str(steps), "--dropout", "0.1", "--delay", str(delay)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(proc: subprocess.Popen, out: Path, steps: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        path = out / "metrics.jsonl"
        if path.exists() and path.read_text().count('"train"') >= steps:
            return
        time.sleep(0.05)
    raise AssertionError("the training subprocess made no progress")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    out = tmp_path_factory.mktemp("straight")
    fit(ToyTask(), _settings(out, max_steps=STEPS))
    return _losses(out)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_saves_then_exits_and_resume_is_bit_identical(tmp_path, uninterrupted, signum):
    out = tmp_path / "run"
    proc = _start(out)
    _wait_for_steps(proc, out, 3)
    if signum == signal.SIGINT:
        # While it trains, the folder is locked: a second trainer is refused at once, naming the holder.
        with pytest.raises(UserError, match=rf"run: another trainer \(pid {proc.pid}\) is writing this folder"):
            fit(ToyTask(), _settings(out, max_steps=STEPS, resume=True))
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    step = load_checkpoint(out)["step"]
    assert 3 <= step < STEPS
    assert err.strip().splitlines()[-1] == (f"interrupted at step {step}, checkpoint saved to {out}; "
                                            "resume with --resume")
    fit(ToyTask(), _settings(out, max_steps=STEPS, resume=True))
    assert _losses(out) == uninterrupted


def test_interrupt_in_process_and_handlers_restored(tmp_path):
    """The first signal stops at the next step boundary with TrainingInterrupted (a KeyboardInterrupt);
    a second one raises at once; fit leaves the caller's handlers as they were."""
    calls = []

    def caller_handler(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGINT, caller_handler)
    term = signal.getsignal(signal.SIGTERM)
    try:
        task = ToyTask()
        real_loss = task.loss

        def loss(model, batch):
            if task.steps_seen == 4:
                signal.raise_signal(signal.SIGINT)
            task.steps_seen += 1
            return real_loss(model, batch)

        task.steps_seen = 0
        task.loss = loss
        with pytest.raises(TrainingInterrupted) as info:
            fit(task, _settings(tmp_path, max_steps=STEPS))
        assert isinstance(info.value, KeyboardInterrupt) and info.value.exit_status == 130
        assert info.value.step == 5 and load_checkpoint(tmp_path)["step"] == 5
        assert signal.getsignal(signal.SIGINT) is caller_handler and signal.getsignal(signal.SIGTERM) is term
        signal.raise_signal(signal.SIGINT)
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_time_based_checkpoints(tmp_path, monkeypatch):
    saved: list[int] = []
    real_save = loop._save

    def spy(task, settings, optimizer, scheduler, ema, progress, *rest):
        saved.append(progress.step)
        real_save(task, settings, optimizer, scheduler, ema, progress, *rest)

    monkeypatch.setattr(loop, "_save", spy)
    fit(ToyTask(), _settings(tmp_path / "often", max_steps=5, eval_each_epoch=False, save_every_minutes=1e-9))
    assert [s for s in saved if s > 0] == [1, 2, 3, 4, 5]
    saved.clear()
    fit(ToyTask(), _settings(tmp_path / "never", max_steps=5, eval_each_epoch=False, save_every_minutes=None))
    assert saved == [5]
    assert TrainSettings(out_dir="x").save_every_minutes == 10
    with pytest.raises(UserError, match="save_every_minutes"):
        TrainSettings(out_dir="x", save_every_minutes=-1)


def test_run_folder_lock(tmp_path):
    with RunFolderLock(tmp_path):
        assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
        with pytest.raises(UserError, match=rf"another trainer \(pid {os.getpid()}\)") as info:
            fit(ToyTask(), _settings(tmp_path, max_steps=2))
        assert "\n" not in str(info.value)
        assert not (tmp_path / "metrics.jsonl").exists()  # refused before touching anything
    fit(ToyTask(), _settings(tmp_path, max_steps=2))  # released: the folder is free again
    with RunFolderLock(tmp_path):  # and fit released it too
        pass


def test_checkpoint_checksum(tmp_path):
    fit(ToyTask(), _settings(tmp_path, max_steps=2))
    path = tmp_path / "checkpoint.pt"
    good = path.read_bytes()
    assert torch.load(path, weights_only=False)["step"] == 2  # still an ordinary torch.save archive
    for where in (len(good) // 2, 100, len(good) - 1, len(good) - 79):  # payload, start, digest, comment size
        damaged = bytearray(good)
        damaged[where] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(UserError, match=r"checkpoint\.pt: damaged checkpoint: checksum mismatch"):
            load_checkpoint(tmp_path)
    path.write_bytes(good[:-30])  # a truncated copy
    with pytest.raises(UserError, match=r"checkpoint\.pt: damaged checkpoint"):
        load_checkpoint(tmp_path)
    damaged = bytearray(good)
    damaged[-70] ^= 0x01  # in the checksum's marker
    path.write_bytes(bytes(damaged))
    with pytest.raises(UserError, match=r"checkpoint\.pt: damaged checkpoint"):
        fit(ToyTask(), _settings(tmp_path, max_steps=4, resume=True))
    # A checkpoint written before checksums existed (a bare torch.save) still loads and resumes.
    path.write_bytes(good)
    payload = load_checkpoint(tmp_path)
    torch.save(payload, path)
    assert load_checkpoint(tmp_path)["step"] == 2
    fit(ToyTask(), _settings(tmp_path, max_steps=4, resume=True))
    assert load_checkpoint(tmp_path)["step"] == 4
    save_checkpoint(tmp_path, {"step": 7})
    assert load_checkpoint(tmp_path)["step"] == 7


def test_torn_metrics_line_is_dropped_with_a_warning(tmp_path):
    fit(ToyTask(), _settings(tmp_path, max_steps=3))
    metrics = tmp_path / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + '\n{"kind": "train", "step": 4, "lo')
    with pytest.warns(RuntimeWarning, match=rf"metrics\.jsonl: line {len(lines) + 1}: dropped an incomplete last line"):
        assert len(read_metrics(metrics)) == len(lines)
    with pytest.warns(RuntimeWarning, match="metrics.jsonl"):
        fit(ToyTask(), _settings(tmp_path, max_steps=5, resume=True))
    assert sorted(_losses(tmp_path)) == [1, 2, 3, 4, 5]  # the resumed run rewrote the file whole
    metrics.write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(UserError, match=r"metrics\.jsonl: line 2: not a JSON object"):
        read_metrics(metrics)


def test_stale_temporaries_are_removed_at_start(tmp_path):
    fit(ToyTask(), _settings(tmp_path, max_steps=2))
    stale = [".checkpoint.pt.k2j4_x9a.tmp", ".metrics.jsonl.abcdefgh.tmp", ".curve.png.0a1b2c3d.tmp"]
    kept = ["notes.tmp", ".hidden", "mine.tmp.txt"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"half a file")
    fit(ToyTask(), _settings(tmp_path, max_steps=3, resume=True))
    names = {p.name for p in tmp_path.iterdir()}
    assert not names & set(stale) and set(kept) <= names
