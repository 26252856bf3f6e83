"""The machine's plan cache (fastqa.data.gemm_cache) keeps the bf16 route decisions beside the GEMM engines:
recorded at a step boundary, restored by the next process (which then measures nothing), never replaced, and
an entry written before routes existed still restores."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastqa._backend import cpu_gemm_info
from fastqa.data.gemm_cache import CACHE_FILE, FORMAT, MachineGemmPlan, machine_key


def _applies() -> bool:
    info = cpu_gemm_info()
    return info is not None and "error" not in info and info["onednn_available"]


pytestmark = pytest.mark.skipif(not _applies(), reason="needs fastqa._C and a torch with oneDNN")

# One bf16 decode step under the machine cache at argv[1]: restore, step, record; prints the step's routes.
_SCRIPT = """
import json, sys, torch
from fastqa._backend import cpu_gemm_info
from fastqa.data.gemm_cache import MachineGemmPlan
plan = MachineGemmPlan.open(sys.argv[1])
plan.restore()
g = torch.Generator().manual_seed(0)
x, state = torch.randn(3, 40, generator=g).bfloat16(), torch.randn(3, 2, 40, generator=g).bfloat16()
w = (torch.randn(80, 40, 3, generator=g) / 11).bfloat16()
torch.ops.fastqa.glu_conv1d_step(x, state, w, None, False, 1.0)
plan.record()
print(json.dumps([r for r in cpu_gemm_info()["routes"] if r["op"] == "glu_conv1d_step"]))
"""


def _step(cache: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("FASTQA_CPU_BF16_ROUTE", "FASTQA_CPU_GEMM")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(cache)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_routes_are_recorded_restored_and_never_replaced(tmp_path):
    cache = tmp_path / CACHE_FILE
    first = _step(cache)
    assert len(first) == 1 and not first[0]["restored"] and first[0]["ms"]["native"] > 0
    key = machine_key(threads=int(first[0]["threads"]))
    entry = json.loads(cache.read_text())["machines"][key]
    want = {k: first[0][k] for k in ("op", "shape", "threads", "route")}
    assert entry["routes"] == [want]
    second = _step(cache)
    assert second == [{**want, "ms": {"native": 0.0, "widen": 0.0}, "restored": True}]
    # The other route planted in the file is the one the next process takes, and the file keeps it as it is.
    other = {"native": "widen", "widen": "native"}[want["route"]]
    data = json.loads(cache.read_text())
    data["machines"][key]["routes"] = [{**want, "route": other}]
    cache.write_text(json.dumps(data))
    assert _step(cache)[0]["route"] == other
    assert json.loads(cache.read_text()) == data


def test_an_entry_without_routes_restores_and_gains_them(tmp_path):
    cache = tmp_path / CACHE_FILE
    key = machine_key()
    cache.write_text(json.dumps({"format": FORMAT,
                                 "machines": {key: {"engine": "blas", "shapes": []}}}))
    plan = MachineGemmPlan(cache, key)
    assert plan.cached() == {"engine": "blas", "shapes": [], "routes": []}
    routes = _step(cache)
    entry = json.loads(cache.read_text())["machines"][machine_key(threads=int(routes[0]["threads"]))]
    assert [r["op"] for r in entry["routes"]] == ["glu_conv1d_step"]


def test_a_file_of_the_first_format_is_measured_again_and_rewritten(tmp_path):
    """The first format's process engine was chosen on one large product, not on the kernels' tiles: such a file
    is not restored, and the next write replaces it with this format's."""
    cache = tmp_path / CACHE_FILE
    key = machine_key()
    cache.write_text(json.dumps({"format": "fastqa-cpu-gemm-1", "machines": {key: {"engine": "onednn", "shapes": []}}}))
    assert MachineGemmPlan(cache, key).cached() is None
    routes = _step(cache)
    data = json.loads(cache.read_text())
    assert data["format"] == FORMAT
    assert list(data["machines"]) == [machine_key(threads=int(routes[0]["threads"]))]


def test_a_malformed_route_is_not_restored(tmp_path, caplog):
    cache = tmp_path / CACHE_FILE
    key = machine_key()
    cache.write_text(json.dumps({"format": FORMAT, "machines": {key: {
        "engine": "blas", "shapes": [], "routes": [{"op": "glu_conv1d_step", "shape": "B=4", "threads": 1,
                                                    "route": "fastest"}]}}}))
    assert MachineGemmPlan(cache, key).cached() is None
    assert "malformed" in caplog.text
