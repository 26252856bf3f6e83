"""scripts/gpu_compile.py (``make gpu-compile``): every Triton kernel, in every autotuning configuration, dtype and
constexpr variant the ops reach, compiles for sm_90 and sm_80 under the pinned Triton of the GPU machine (installed
by ``make test-gpu-compile`` / ``make gpu-compile`` into .venv/triton-<version>), within shared memory, with no spills in the
configurations the models can reach, and the resource table in docs/gpu-compile.md is current.

The check runs once, in a subprocess (TRITON_INTERPRET unset, the pinned folder first on PYTHONPATH), through the
results cache in .venv/ (a first run compiles about 3,100 kernels, minutes of both cores; then seconds). A session
that collects these tests starts it in the background as soon as collection ends (``start``, from conftest's
``pytest_collection_finish``), at a lower priority, and runs these tests last: collected with other tests (``pytest tests``), the compiles fill
the core that those (tiny models on one torch thread) leave idle, and the ``report`` fixture waits for what is left.
``make test`` leaves this file to ``make test-gpu-compile``, which CI runs after it.
Without the pinned Triton (no registry access) the tests fail under CI=true and skip elsewhere.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Optional

import pytest
from helpers import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_compile.py"


#: The background check's niceness: the other tests' processes go first, the compiles take the idle time.
NICENESS = 10


@functools.cache
def _script() -> ModuleType:
    return load_script(SCRIPT)


def _pinned() -> Path:
    return Path(os.environ.get("FASTQA_TRITON_PIN_DIR", REPO / ".venv" / f"triton-{_script().EXPECTED_TRITON}"))


#: The one run of the check in this session: its process, its report's path and its output's file.
_RUN: dict = {}


def start() -> None:
    """Start the check in the background, once per session (nothing without the pinned Triton: the ``report``
    fixture says why). Its own session, so that ``stop`` ends its compile workers with it."""
    if _RUN or not (_pinned() / "triton" / "__init__.py").exists():
        return
    folder = Path(tempfile.mkdtemp(prefix="fastqa-gpu-compile-test-"))
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)   # conftest sets it for the interpreter tests; this check compiles for GPUs
    env["PYTHONPATH"] = os.pathsep.join([str(_pinned())] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    log = folder / "output.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--json", str(folder / "report.json")], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.nice(NICENESS))
    _RUN.update(proc=proc, report=folder / "report.json", log=log)


def stop() -> None:
    """At the session's end: end the check if it is still running (a session interrupted, or its tests
    deselected after it started), and remove its report's folder."""
    proc: Optional[subprocess.Popen] = _RUN.get("proc")
    if proc is not None and proc.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                break
    if _RUN:
        shutil.rmtree(_RUN["report"].parent, ignore_errors=True)


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return _script()


@pytest.fixture(scope="module")
def report(script: ModuleType) -> dict:
    """The check's JSON report (findings, totals, table), from its one run in this session (started by ``start``;
    here when conftest did not)."""
    pinned = _pinned()
    if not (pinned / "triton" / "__init__.py").exists():
        reason = (f"triton=={script.EXPECTED_TRITON} is not installed in {pinned} (`make test` and `make gpu-compile` "
                  "install it with pip, which needs registry access): the GPU compile check cannot run")
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(reason)
        pytest.skip(reason)
    start()
    proc, out = _RUN["proc"], _RUN["report"]
    try:
        returncode = proc.wait(timeout=4 * 3600)
    except subprocess.TimeoutExpired:
        stop()
        raise
    output = _RUN["log"].read_text(errors="replace")
    assert out.exists(), f"no report; exit code {returncode}\n{output[-8000:]}"
    data = json.loads(out.read_text())
    data["returncode"], data["stderr"] = returncode, output
    return data


def test_the_pinned_triton_ran(report: dict, script: ModuleType) -> None:
    assert report["stats"]["triton"] == script.EXPECTED_TRITON


def test_every_kernel_is_launched_by_some_case(report: dict) -> None:
    assert report["findings"]["uncovered"] == []
    assert report["stats"]["kernels"] >= 20


def test_no_compile_errors(report: dict) -> None:
    assert report["findings"]["compile_errors"] == []


def test_shared_memory_within_the_per_block_limit(report: dict) -> None:
    assert report["findings"]["shared_memory"] == []


def test_no_spills_in_configurations_the_models_reach(report: dict) -> None:
    assert report["findings"]["model_spills"] == []


def test_launch_grids_within_limits(report: dict) -> None:
    assert report["findings"]["grid"] == []


def test_the_check_passes(report: dict) -> None:
    assert report["returncode"] == 0, report["stderr"][-5000:]


def test_the_docs_table_is_current(report: dict, script: ModuleType) -> None:
    assert script.block(script.TABLE_DOC, script.TABLE_MARKERS) == report["table"], \
        "docs/gpu-compile.md is not current: run `make gpu-compile`"
    assert script.block(script.SUMMARY_DOC, script.SUMMARY_MARKERS) == report["summary"], \
        "docs/backends.md's gpu-compile summary is not current: run `make gpu-compile`"


def test_occupancy_arithmetic(script: ModuleType) -> None:
    """Registers allocated per warp in units of 256 of 65536, shared memory plus 1 KB per block, 32 blocks."""
    sm90, sm80 = script.TARGETS
    assert script.occupancy(32, 0, 4, sm90) == (1.0, "warps")            # 16 blocks of 4 warps
    assert script.occupancy(128, 0, 4, sm90) == (0.25, "registers")      # 4096 per warp: 16 warps
    assert script.occupancy(255, 0, 8, sm90) == (0.125, "registers")     # 8192 per warp: 8 warps, one block
    assert script.occupancy(16, 0, 1, sm90) == (0.5, "blocks")           # 32 blocks of 1 warp
    assert script.occupancy(32, 100 * 1024, 4, sm90) == (0.125, "shared")  # 2 blocks in 228 KB
    assert script.occupancy(32, 100 * 1024, 4, sm80) == (0.0625, "shared")  # 1 block in 164 KB
