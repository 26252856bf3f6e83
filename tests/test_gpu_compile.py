"""scripts/gpu_compile.py (``make gpu-compile``): every Triton kernel, in every autotuning configuration, dtype and
constexpr variant the ops reach, compiles for sm_90 and sm_80 under the pinned Triton of the GPU machine (installed
by ``make test`` / ``make gpu-compile`` into .venv/triton-<version>), within shared memory, with no spills in the
configurations the models can reach, and the resource table in docs/gpu-compile.md is current.

The check runs once, in a subprocess (TRITON_INTERPRET unset, the pinned folder first on PYTHONPATH), through the
results cache in .venv/ (a first run compiles a few thousand kernels: tens of minutes on 2 cores; then seconds).
Without the pinned Triton (no registry access) the tests fail under CI=true and skip elsewhere.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_compile.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def report(script: ModuleType, tmp_path_factory) -> dict:
    """The check's JSON report (findings, totals, table), from one run of the script."""
    pinned = Path(os.environ.get("FASTQA_TRITON_PIN_DIR", REPO / ".venv" / f"triton-{script.EXPECTED_TRITON}"))
    if not (pinned / "triton" / "__init__.py").exists():
        reason = (f"triton=={script.EXPECTED_TRITON} is not installed in {pinned} (`make test` and `make gpu-compile` "
                  "install it with pip, which needs registry access): the GPU compile check cannot run")
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(reason)
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("gpu-compile") / "report.json"
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)   # conftest sets it for the interpreter tests; this check compiles for GPUs
    env["PYTHONPATH"] = os.pathsep.join([str(pinned)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=4 * 3600)
    assert out.exists(), f"no report; exit code {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    data = json.loads(out.read_text())
    data["returncode"], data["stderr"] = proc.returncode, proc.stderr
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
