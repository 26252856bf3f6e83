"""Faults injected into training, nothing lost: a kill -9 at every point of a checkpoint write, a full disk
(a file-size limit) while saving, and a rank of a 2-process torchrun run killed (with and without torchrun's
restarts).

The kills are exact: ``FASTQA_FAULT_POINT=NAME@N`` makes the N-th arrival at the named point of the write
(``fastqa.data.files.fault_point``) send SIGKILL to the training process itself."""
from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastqa.data.files import _size
from fastqa.errors import UserError
from fastqa.train import TrainSettings, fit, load_checkpoint
from fastqa.data.metrics import read_metrics
from toy_task import ToyTask

TESTS = Path(__file__).resolve().parents[1]
STEPS, EVERY = 12, 4   # checkpoints at steps 4, 8 and 12; the kills hit the second one (step 8)
POINTS = ["before", "created", "half", "written", "synced", "renamed"]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FASTQA_FAULT_POINT"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    return env


def _toy(out: Path, steps: int = STEPS, *extra: str) -> list[str]:
    return [str(TESTS / "toy_task.py"), str(out), str(steps), "--dropout", "0.1", "--eval-every", str(EVERY), *extra]


def _settings(out: Path, **kw) -> TrainSettings:
    # What tests/toy_task.py trains with (--dropout 0.1 --eval-every 4), so in-process runs compare with it.
    base = dict(out_dir=str(out), max_steps=STEPS, clip_norm=5.0, ema_decay=0.99, eval_every=EVERY, log_every=1,
                progress=False)
    base.update(kw)
    return TrainSettings(**base)


def _rows(out: Path) -> list[tuple]:
    """metrics.jsonl without its clock times: (kind, step, loss or dev_loss)."""
    return [(r["kind"], r["step"], r.get("loss", r.get("dev_loss"))) for r in read_metrics(out / "metrics.jsonl")]


def _temporaries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> list[tuple]:
    out = tmp_path_factory.mktemp("straight")
    fit(ToyTask(dropout=0.1), _settings(out))
    rows = _rows(out)
    assert [s for k, s, _ in rows if k == "eval"] == [4, 8, 12]
    return rows


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_during_a_checkpoint_write_resumes_from_the_last_complete_one(tmp_path, straight, point):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, *_toy(out)], env=_env(FASTQA_FAULT_POINT=f"checkpoint.pt:{point}@2"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # The second checkpoint (step 8) was being written: before its rename the first one (step 4) is the one
    # on disk, whole; from the rename on, the new one.
    kept = 8 if point == "renamed" else 4
    assert load_checkpoint(out)["step"] == kept
    assert bool(_temporaries(out)) == (point in ("created", "half", "written", "synced"))
    # The metrics of the steps after that checkpoint are dropped on resume; the resumed run trains them again
    # and its whole log equals the uninterrupted run's, loss for loss and evaluation for evaluation.
    fit(ToyTask(dropout=0.1), _settings(out, resume=True))
    assert _rows(out) == straight
    assert load_checkpoint(out)["step"] == STEPS
    assert _temporaries(out) == []


def test_kill_9_while_resuming_rewrites_the_metrics_log(tmp_path, straight):
    """The resume's own write (metrics.jsonl cut back to the checkpoint's step) killed before its rename."""
    out = tmp_path / "run"
    fit(ToyTask(dropout=0.1), _settings(out, max_steps=8))  # ends on an evaluation the straight run has too
    proc = subprocess.run([sys.executable, *_toy(out, STEPS, "--resume")],
                          env=_env(FASTQA_FAULT_POINT="metrics.jsonl:synced"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    fit(ToyTask(dropout=0.1), _settings(out, resume=True))
    assert _rows(out) == straight


def _limit_file_size(limit: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    return preexec


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    out = tmp_path / "run"
    fit(ToyTask(dropout=0.1), _settings(out, max_steps=EVERY))
    before = (out / "checkpoint.pt").read_bytes()
    # metrics.jsonl stays far below the limit; the learning curve and a checkpoint are at least twice as big (a
    # checkpoint carries the process's GEMM decisions: in a process that ran other models first, many of them).
    limit = min(len(before), (out / "curve.png").stat().st_size) // 2
    proc = subprocess.run([sys.executable, *_toy(out, STEPS, "--resume")], env=_env(), capture_output=True,
                          text=True, timeout=120, preexec_fn=_limit_file_size(limit))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # The new checkpoint's size is near the previous one's, not equal: it also carries what the run measured since
    # (the machine's GEMM and bf16 route choices).
    assert lines[0].startswith(f"error: {out / 'checkpoint.pt'}: cannot write the checkpoint (File too large): "
                               "it needs "), lines[0]
    needed = re.search(r"it needs ([0-9.]+) kB, ", lines[0])
    assert needed and limit < 1e3 * float(needed.group(1)) < 2 * len(before), lines[0]
    assert " free there" in lines[0] and f"at most {_size(limit)} (ulimit -f)" in lines[0]
    assert lines[0].endswith("; the previous one is unchanged")
    assert "the learning curve is not updated: " in proc.stderr   # written first, bigger here: a warning
    assert (out / "checkpoint.pt").read_bytes() == before and _temporaries(out) == []
    # Room again: the run resumes from that checkpoint.
    fit(ToyTask(dropout=0.1), _settings(out, resume=True))
    assert load_checkpoint(out)["step"] == STEPS


def test_no_room_is_one_line_for_every_file_and_only_for_no_room(tmp_path):
    """ENOSPC or EDQUOT read like EFBIG, without the limit's clause (none is involved); an atomic write's
    failure (the learning curve's, an export's) and a metrics row's say as much as the checkpoint's."""
    import errno

    from fastqa.data.files import atomic_write_text, no_room_error

    path = tmp_path / "checkpoint.pt"
    error = no_room_error(path, OSError(errno.ENOSPC, "No space left on device"), needed=3_000_000,
                          what="the checkpoint")
    assert isinstance(error, UserError)
    assert str(error).startswith(f"{path}: cannot write the checkpoint (No space left on device): it needs 3.0 MB, ")
    assert str(error).endswith(" free there; nothing was written")
    assert no_room_error(path, OSError(errno.EACCES, "Permission denied")) is None

    # Real writes past a file-size limit, in a child process (the limit is the process's).
    script = f"""
import resource, signal, sys
from fastqa.data.files import atomic_write_text
from fastqa.errors import UserError
from fastqa.data.metrics import MetricsLog
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
for write in (lambda: atomic_write_text({str(tmp_path / 'a.txt')!r}, "x" * 5000),
              lambda: MetricsLog({str(tmp_path)!r}, resume_step=None).write({{"step": 1, "pad": "x" * 5000}})):
    try:
        write()
    except (UserError, OSError) as e:  # an optional write (an OSError) or the training's own (a UserError)
        print(type(e).__name__, e)
"""
    atomic_write_text(tmp_path / "a.txt", "old")
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.splitlines()
    # An atomic write stays an OSError (what the optional writes, a cache or the GEMM decisions, catch), telling
    # the same: the CLI prints it as one line.
    assert re.fullmatch(r"OSError \[Errno 27\] File too large \([0-9.]+ [kMG]?B free there, and this process may write "
                        r"files of at most 1\.0 kB \(ulimit -f\); the previous one is unchanged\): "
                        + re.escape(repr(str(tmp_path / "a.txt"))), first), first
    assert second.startswith(f"UserError {tmp_path / 'metrics.jsonl'}: cannot write a metrics row (File too large): "), second
    assert second.endswith("; the rows before it are kept (a cut last line is dropped when read)"), second
    assert (tmp_path / "a.txt").read_text() == "old" and _temporaries(tmp_path) == []
    assert not (tmp_path / "metrics.jsonl").read_text().endswith("}\n")   # the row that did not fit is cut
    assert [_size(n) for n in (512, 20_480, 3_000_000, 1_234_000_000)] == ["512 bytes", "20.5 kB", "3.0 MB", "1.2 GB"]


def _torchrun(out: Path, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *flags,
           *_toy(out, STEPS, "--delay", "0.2")]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rank_pid(agent: subprocess.Popen, rank: int) -> int:
    """The pid of the worker of ``rank`` started by torchrun's agent (read from its environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == agent.pid and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"torchrun has no worker of rank {rank}")


def _wait_for_workers(agent: subprocess.Popen) -> None:
    """Wait until torchrun has started the workers of ranks 0 and 1."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert agent.poll() is None, agent.communicate()[1][-3000:]
        try:
            _rank_pid(agent, 0), _rank_pid(agent, 1)
            return
        except AssertionError:
            time.sleep(0.05)
    raise AssertionError("torchrun started no workers")


def _kill_rank_after(agent: subprocess.Popen, out: Path, step: int, rank: int = 1) -> tuple[float, list[dict]]:
    """SIGKILL the worker of ``rank`` once metrics.jsonl shows ``step``; returns when (time.monotonic()) and
    the rows logged by then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert agent.poll() is None, agent.communicate()[1][-3000:]
        rows = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
        logged = max((r["step"] for r in rows if r["kind"] == "train"), default=0)
        if logged >= step:
            os.kill(_rank_pid(agent, rank), signal.SIGKILL)
            return time.monotonic(), rows
        time.sleep(0.02)
    raise AssertionError("the distributed run made no progress")


DEAD_RANK_EXIT_S = 30  # the survivor's exit after a rank is killed, bounded (measured: under a second idle)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_rank_stops_the_other_with_one_line_and_torchrun_restarts_resume(tmp_path, straight):
    """Rank 1 killed after the checkpoint of step 4: rank 0 exits at once with one line naming rank 1, torchrun
    (--max-restarts 1) starts both ranks again, they resume from the last checkpoint by themselves, and the
    steps they train again give the losses the first attempt logged for them."""
    out = tmp_path / "run"
    agent = _torchrun(out, "--max-restarts", "1")
    _wait_for_workers(agent)
    survivor = _rank_pid(agent, 0)
    killed, rows = _kill_rank_after(agent, out, 6)
    while not _gone(survivor) and time.monotonic() < killed + DEAD_RANK_EXIT_S:
        time.sleep(0.02)
    survivor_s = time.monotonic() - killed
    assert _gone(survivor), "rank 0 did not exit after rank 1 was killed"
    _, err = agent.communicate(timeout=180)
    took = time.monotonic() - killed
    assert agent.returncode == 0, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error: rank 0:")]
    assert len(lines) == 1, err[-3000:]
    # gloo says "Connection closed by peer" or "Read error ...: Connection reset by peer" (which side noticed).
    assert re.match(r"error: rank 0: rank 1 of 2 is gone \(.*Connection (closed|reset) by peer", lines[0]), lines[0]
    assert f"{out} keeps the last checkpoint: resume with --resume" in lines[0]
    assert load_checkpoint(out)["step"] == STEPS
    # Resumed, not started again: the rows up to the checkpoint are the first attempt's, clock times included.
    kept = [r for r in read_metrics(out / "metrics.jsonl") if r in rows]
    assert [(r["kind"], r["step"]) for r in kept][-1] in (("eval", 4), ("eval", 8)), kept
    logged = max(r["step"] for r in rows)
    print(f"\nrank 1 killed at step {logged}: rank 0 exited {survivor_s:.1f} s later; torchrun restarted both "
          f"ranks, which resumed at step {kept[-1]['step']} ({logged - kept[-1]['step']} steps trained again) and "
          f"finished {took:.1f} s after the kill")
    # The log reads as one run, and the steps trained twice have the same losses, to the bit.
    final = _rows(out)
    assert [(k, step) for k, step, _ in final] == [(k, step) for k, step, _ in straight]   # 1 process: same layout
    again = {r["step"]: r["loss"] for r in rows if r["kind"] == "train" and r["step"] > kept[-1]["step"]}
    assert again and {step: loss for k, step, loss in final if step in again and k == "train"} == again


def test_the_roll_call_names_the_ranks_that_do_not_answer():
    """Beyond 2 ranks, the survivors learn who is gone by a roll call through the process group's store."""
    import torch.distributed as dist

    from fastqa.train.distributed import DistEnv, lost_ranks

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set("fastqa/roll-call/0/2", "here")   # rank 2 answered, rank 1 never does
        t0 = time.monotonic()
        assert lost_ranks(DistEnv(rank=0, world_size=3), wait_s=0.3) == [1]
        assert 0.3 <= time.monotonic() - t0 < 5
        store.set("fastqa/roll-call/0/1", "here")
        assert lost_ranks(DistEnv(rank=0, world_size=3), wait_s=0.3) == []
        assert lost_ranks(DistEnv(rank=1, world_size=2)) == [0]
    finally:
        dist.destroy_process_group()
