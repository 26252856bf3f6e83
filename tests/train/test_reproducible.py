"""Reproducible by default: fresh training runs on one machine give bit-identical losses because the CPU
GEMM engine decisions are made once per machine (fastqa.data.gemm_cache) and restored before the first
step; a resumed run equals an uninterrupted one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastqa._backend import cpu_gemm_info
from fastqa.data.files import user_cache_dir
from fastqa.data.gemm_cache import CACHE_FILE, FORMAT, MachineGemmPlan, machine_key

TESTS = Path(__file__).resolve().parents[1]


def _env(cache: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FASTQA_CPU_GEMM"}
    env.update(OMP_NUM_THREADS="1", FASTQA_CACHE_DIR=str(cache),
               PYTHONPATH=str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    return env


def _train(out: Path, steps: int, env: dict, *extra: str) -> dict | None:
    """Train ToyGemmTask in a fresh process; returns its final cpu_gemm_info()."""
    info = out.with_suffix(".gemm.json")
    cmd = [sys.executable, str(TESTS / "toy_task.py"), str(out), str(steps), "--gemm", "--dropout", "0.1",
           "--gemm-info", str(info), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(info.read_text())


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def _engines(info: dict) -> dict[tuple, str]:
    return {(s["m"], s["k"], s["n"], s["a"], s["w"], s["bias"], s["accumulate"]): s["engine"] for s in info["shapes"]}


def _gemm_cache_applies() -> bool:
    info = cpu_gemm_info()
    return info is not None and "error" not in info and info["onednn_available"]


def test_two_fresh_runs_are_bit_identical_and_resume_equals_straight(tmp_path):
    cache = tmp_path / "cache"
    env = _env(cache)
    first = _train(tmp_path / "first", 40, env)    # epochs of 12 steps: the evaluation's shapes show up at 12
    second = _train(tmp_path / "second", 40, env)
    assert _losses(tmp_path / "second") == _losses(tmp_path / "first")
    _train(tmp_path / "split", 20, env)
    _train(tmp_path / "split", 40, env, "--resume")
    assert _losses(tmp_path / "split") == _losses(tmp_path / "first")
    if not _gemm_cache_applies():
        return
    # The first run measured and kept its decisions for the machine; the second measured nothing.
    assert first["shapes"] and not any(s["restored"] for s in first["shapes"])
    assert all(s["restored"] for s in second["shapes"])
    assert _engines(second) == _engines(first) and second["engine"] == first["engine"]
    machines = json.loads((cache / CACHE_FILE).read_text())["machines"]
    assert list(machines) == [machine_key(threads=1)]
    assert len(machines[machine_key(threads=1)]["shapes"]) == len(first["shapes"])


@pytest.mark.skipif(not _gemm_cache_applies(), reason="needs fastqa._C and a torch with oneDNN")
def test_the_machine_decisions_are_the_ones_used(tmp_path):
    """A cache that says oneDNN for every shape trains exactly as FASTQA_CPU_GEMM=onednn, and the run adds
    nothing to it and replaces nothing in it (nor in another thread count's entry)."""
    measured = tmp_path / "measured"
    _train(tmp_path / "measure", 6, _env(measured))
    key = machine_key(threads=1)
    entry = json.loads((measured / CACHE_FILE).read_text())["machines"][key]
    cache = tmp_path / "cache"
    cache.mkdir()
    planted = {"format": FORMAT, "machines": {
        key: {"engine": "onednn", "shapes": [{**s, "engine": "onednn"} for s in entry["shapes"]]},
        machine_key(threads=3): {"engine": "blas", "shapes": []}}}
    (cache / CACHE_FILE).write_text(json.dumps(planted))
    info = _train(tmp_path / "planted", 6, _env(cache))
    _train(tmp_path / "forced", 6, _env(tmp_path / "unused", FASTQA_CPU_GEMM="onednn"))
    assert _losses(tmp_path / "planted") == _losses(tmp_path / "forced")
    assert info["engine"] == "onednn" and info["shapes"]
    assert all(s["restored"] and s["engine"] == "onednn" for s in info["shapes"])
    assert json.loads((cache / CACHE_FILE).read_text()) == planted
    assert not (tmp_path / "unused").exists()  # a forced engine has nothing to decide, so nothing is cached


def test_cache_folder_and_damaged_cache(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FASTQA_CACHE_DIR", str(tmp_path / "c"))
    assert user_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FASTQA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert user_cache_dir() == tmp_path / "x" / "fastqa"
    # This process's engine forced (FASTQA_CPU_GEMM=blas|onednn, as `make test-numerics` sets it): nothing to cache.
    if not _gemm_cache_applies() or cpu_gemm_info()["requested"] != "auto":
        return
    path = tmp_path / CACHE_FILE
    path.write_text("{not json")
    plan = MachineGemmPlan.open(path)
    assert plan.restore() is False and "unreadable GEMM plan cache" in caplog.text
    plan.record()  # replaces the damaged file with this process's decisions
    assert json.loads(path.read_text())["machines"][machine_key()]["engine"] in ("blas", "onednn")
