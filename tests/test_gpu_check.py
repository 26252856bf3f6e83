"""scripts/gpu_check (``make gpu-check``) in its tiny mode on the CPU: the summary it writes names every phase
with a status, the op phase reports errors for every op, and time boxes skip phases with a note instead of
dropping them. One subprocess run of the package with every phase; the rest calls its functions directly."""
from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import TOLERANCES, load_script
from tolerances import TABLE

import fastqa

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check"   # a package, run as a folder
STATUSES = {"ok", "failed", "skipped"}


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, dict]:
    """Every phase, tiny, on the CPU; phase e gets a budget under the least it needs, so it must be skipped."""
    out = tmp_path_factory.mktemp("gpu-check")
    env = dict(os.environ)
    # The CPU run of a machine without a GPU, also where the suite runs on one: no device for the nested pytest of
    # phase a to run GPU tests on, no Triton interpreter (the CPU kernels are what the tiny run checks).
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("TRITON_INTERPRET", None)
    env["OMP_NUM_THREADS"] = "1"   # tiny shapes: a second thread only adds synchronisation on a busy machine
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--out", str(out),
                           "--budget-s", "400", "--phase-budget", "e=0.5"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    summary_json = out / "summary.json"
    assert summary_json.exists(), f"no summary.json; exit code {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, out, json.loads(summary_json.read_text())


def _phases(summary: dict) -> dict[str, dict]:
    return {p["key"]: p for p in summary["phases"]}


def test_the_summary_names_every_phase_with_a_status(tiny_run, gpu_check):
    proc, out, summary = tiny_run
    phases = _phases(summary)
    assert list(phases) == list(gpu_check.PHASE_KEYS)
    for key, phase in phases.items():
        assert phase["status"] in STATUSES, phase
        if phase["status"] != "ok":
            assert phase.get("reason"), f"phase {key} is {phase['status']} without a reason"
    # On the CPU every phase that ran passes: a failure here is a real one (its reason and tail say which).
    bad = {k: (p.get("reason"), (p.get("result") or {}).get("error_tail")) for k, p in phases.items()
           if k != "e" and p["status"] != "ok"}
    assert not bad, bad
    assert proc.returncode == 0, proc.stdout[-3000:]
    text = (out / "summary.txt").read_text()
    for key, phase in phases.items():
        assert f"phase {key}  " in text and phase["status"] in text
    env = summary["environment"]
    assert env["torch"] and env["python"] and env["device"]["type"] == "cpu" and "backends" in env["fastqa"]
    assert (out / "logs" / "a-pytest.log").exists() and (out / "logs" / "b.log").exists()


def test_a_phase_given_too_little_budget_is_skipped_with_a_note(tiny_run):
    _, out, summary = tiny_run
    e = _phases(summary)["e"]
    assert e["status"] == "skipped" and "needs at least" in e["reason"], e
    assert "phase e" in (out / "summary.txt").read_text()


def test_the_op_phase_reports_errors_for_every_op(tiny_run):
    _, _, summary = tiny_run
    items = _phases(summary)["b"]["result"]["items"]
    for op in fastqa.ops.__all__:
        for dtype in ("float32", "bfloat16"):
            mine = [i for i in items if i["op"] == op and i["dtype"] == dtype]
            assert mine, f"no {dtype} check of {op}"
            for item in mine:
                assert item["status"] == "ok", item
                assert "out" in item["tensors"]
                for name, err in item["tensors"].items():
                    assert err["finite"] and math.isfinite(err["max_abs"]) and math.isfinite(err["rel"]), (op, name)
                    assert err["rel"] <= item["tolerance"]
    # Every differentiable op reports its gradients too.
    cqa = next(i for i in items if i["op"] == "context_query_attention")
    assert {"grad_c", "grad_q", "grad_weight", "grad_bias"} <= set(cqa["tensors"])


def test_the_model_phases_measure_every_item(tiny_run):
    _, _, summary = tiny_run
    phases = _phases(summary)
    qanet = phases["c"]["result"]["items"]
    assert {(i["mode"], i["precision"], i["impl"]) for i in qanet} >= {
        (m, p, impl) for m in ("train", "infer") for p in ("bf16", "fp32") for impl in ("fast", "reference")}
    assert any(i["impl"] == "compiled" and i["status"] == "ok" for i in qanet)
    for i in qanet:
        assert i["median_ms"] > 0 and i["runs"] >= 1
        if i["mode"] == "infer" and i["impl"] == "fast" and i["precision"] == "fp32":
            assert i["max_diff_vs_reference"] < 1e-4   # same weights, no dropout: the same probabilities
    convs2s = {i["name"]: i for i in phases["d"]["result"]["items"]}
    full = next(i for n, i in convs2s.items() if n.endswith("fast full recompute") and "beam" in n)
    assert full["sentences_per_s"] > 0 and full["same_output_as_incremental"] == 1.0


def test_the_launch_phase_times_every_op_apart(tiny_run):
    _, _, summary = tiny_run
    items = _phases(summary)["f"]["result"]["items"]
    assert {i["op"] for i in items} == set(fastqa.ops.__all__)
    for i in items:
        assert i["status"] == "ok", i
        assert i["fastqa_fwd_ms"] > 0 and i["eager_fwd_ms"] > 0
    dwsep = next(i for i in items if i["op"] == "dwsep_conv1d")
    assert dwsep["fastqa_fwdbwd_ms"] > 0 and any("ncalls" in line for line in dwsep["host_profile"])


def test_a_phase_that_overruns_is_cut_and_the_later_ones_still_run(gpu_check, tmp_path):
    """The QANet phase gets a box far shorter than its items (and the check is run in-process, as a device
    command would): what it finished is recorded, the rest is skipped with the reason, and the ConvS2S phase
    after it runs in full; the exit code is 0 whatever happened."""
    code = gpu_check.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--phases", "c,d",
                           "--phase-budget", "c=3", "--phase-budget", "d=120"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    phases = _phases(summary)
    c, d = phases["c"], phases["d"]
    assert c["time_box_s"] == 3 and c["seconds"] < 3 + gpu_check.KILL_GRACE_S + 5, c
    items = c["result"]["items"]
    skipped = [i for i in items if i["status"] == "skipped"]
    assert skipped and all("time box" in i["reason"] for i in skipped), items
    assert c["status"] in ("ok", "skipped", "failed") and c.get("reason"), c
    assert d["status"] == "ok" and all(i["status"] == "ok" for i in d["result"]["items"]), d
    text = (tmp_path / "summary.txt").read_text()
    assert "phase c" in text and "time box" in text


def test_a_spent_global_budget_skips_every_phase_with_a_note(gpu_check, tmp_path):
    assert gpu_check.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--budget-s", "0"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["status"] for p in summary["phases"]] == ["skipped"] * len(gpu_check.PHASES)
    assert all("global budget" in p["reason"] for p in summary["phases"])
    assert "skipped" in (tmp_path / "summary.txt").read_text()


def test_time_boxes(gpu_check):
    # Slack: what the global budget leaves over the later phases' budgets goes to the phase about to start.
    assert gpu_check.time_box(80, False, remaining_s=480, later_budgets_s=300) == 180
    assert gpu_check.time_box(80, False, remaining_s=330, later_budgets_s=300) == 80
    assert gpu_check.time_box(80, False, remaining_s=50, later_budgets_s=300) == 50   # never past the global budget
    assert gpu_check.time_box(80, True, remaining_s=480, later_budgets_s=0) == 80     # an explicit budget is exact
    assert gpu_check.time_box(80, False, remaining_s=-1, later_budgets_s=0) == 0


def test_helpers(gpu_check):
    command_phases = importlib.import_module("gpu_check.command_phases")
    measuring = importlib.import_module("gpu_check.measuring")
    counts = command_phases._pytest_counts("....\n3 passed, 2 skipped, 1015 deselected, 1 warning in 1.17s\n")
    assert counts == {"passed": 3, "skipped": 2, "deselected": 1015, "warning": 1}
    events = measuring.classify_device_events(["_dwsep_fwd_kernel", "Memcpy HtoD (Pageable -> Device)",
                                               "Memset (Device)", "cudaStreamSynchronize", "_dwsep_fwd_kernel"])
    assert (events["kernels"], events["memcpy"], events["memset"]) == (2, 1, 1)
    assert events["top"] == ["_dwsep_fwd_kernel x2"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--phases", "a,z", "--device", "cpu"])


def test_the_gpu_check_judges_by_the_one_tolerance_table(gpu_check):
    """Phase b's thresholds are the "gpu check" row of tests/tolerances.py, the table the tests read, not a copy
    of their own."""
    common = importlib.import_module("gpu_check.common")
    assert common.TOLERANCES == {dtype: atol for dtype, (atol, _) in TABLE["gpu check"].items()}
    assert common.TOLERANCES == {"float32": 1e-4, "bfloat16": 2e-2}   # the thresholds phase b has always used
    assert TOLERANCES["gpu check"][torch.float32] == (1e-4, 0.0)
