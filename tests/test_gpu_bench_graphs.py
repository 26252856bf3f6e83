"""scripts/gpu_bench_graphs.py (the CUDA-graph benchmark a GPU runs as one command): its argument checks, and its
--dry-run on the CPU -- every section and item runs on tiny shapes and lands in the JSON record (torch.compile
left out), so the command is ready when a GPU is."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_bench_graphs.py"
SCRIPT_MODULE_GPU_TESTS = load_script(SCRIPT).GPU_TESTS


def test_arguments_are_checked():
    bench = load_script(SCRIPT)
    args = bench.parse_args(["--out", "x", "--sections", "glu,qanet"])
    assert args.sections == ["glu", "qanet"] and args.budget_s == 270.0 and not args.dry_run
    for bad in (["--out", "x", "--sections", "qanet,nope"], ["--out", "x", "--budget-s", "0"], ["--sections", "glu"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2
    assert bench.slug("NVIDIA H200") == "nvidia-h200"


def test_dry_run_runs_every_item_on_the_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")   # tiny shapes: a second thread only adds synchronisation
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("cpu-*-graphs-dry-run.json")
    record = json.loads(path.read_text())
    items = record["items"]
    assert record["dry_run"] is True and record["schema"] == "gpu-bench-graphs/1"
    errors = {k: v["error"] for k, v in items.items() if "error" in v}
    assert not errors, errors
    for precision in ("bf16", "fp32"):
        for mode in ("train", "infer"):
            figures = items[f"qanet {mode} {precision}"]
            assert {"fastqa graphed", "fastqa eager", "reference eager"} <= set(figures)
            assert all(figures[k]["median_ms"] > 0 for k in ("fastqa graphed", "fastqa eager", "reference eager"))
            assert items[f"qanet {mode} {precision} compiled"]["skipped"] == "--dry-run compiles nothing"
    # Inference without dropout: the static-buffer reader reads what the eager layers read.
    assert items["qanet infer fp32"]["fastqa graphed"]["max_diff_vs_reference"] < 1e-4
    assert items["profile qanet train bf16 graphed"]["top"]
    assert items["convs2s translate greedy"]["fastqa graphed"]["same_tokens_as_eager"] == 1.0
    assert items["convs2s translate beam2"]["fastqa graphed"]["same_tokens_as_eager"] == 1.0
    assert {"convs2s train fp32", "convs2s train bf16"} <= set(items)
    assert sum(k.startswith("glu_conv1d_step") for k in items) == 4
    assert items["gpu tests"]["skipped"].startswith("--dry-run runs no test")
    for name in SCRIPT_MODULE_GPU_TESTS:
        assert (SCRIPT.parent.parent / name).is_file(), name
