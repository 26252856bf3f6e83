"""Running a phase's command in the supervisor: in the repository, output to a log, in a process group of its
own that a time box can stop as a whole; and the environment every phase runs in."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import REPO


def _own_process_group() -> dict[str, Any]:
    """Popen arguments that start the command as the leader of a new process group, so that a timeout can
    signal the command and everything it started (and nothing else) by that group's id."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def run_process(cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` in the repository, output to ``log``, in a process group of its own; on timeout the group
    (pytest-xdist workers, compile workers) gets SIGTERM, then SIGKILL. -> (exit code or None on timeout, seconds)."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, **_own_process_group())
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return rc, time.perf_counter() - t0


def child_env(autotune: bool = False) -> dict[str, str]:
    """The phases' environment: unbuffered output, and each Triton kernel on its first configuration unless
    ``--autotune`` (tuning compiles every configuration of every kernel per shape bucket and dtype: minutes of a
    first device run; the first configurations are the ones the compile check proves, spill-free)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["FASTQA_TRITON_AUTOTUNE"] = "1" if autotune else "0"
    return env
