"""Phases a and e, in the supervisor: commands of their own (the GPU tests under pytest, the quick benchmark),
each run under its time box by ``processes.run_process`` and summarised from what it left behind (pytest's
summary line, the benchmark's results.json, saved after every case)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from .common import TAIL_LINES, read_tail, tail
from .processes import child_env, run_process


def run_pytest_phase(args: argparse.Namespace, box: float, logs: Path) -> dict[str, Any]:
    """Phase a: the tests marked ``gpu`` in tests/ops, in parallel where pytest-xdist is installed."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/ops", "-q", "-x", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(min(8, max(2, (os.cpu_count() or 2) // 2)))]
    log = logs / "a-pytest.log"
    rc, seconds = run_process(cmd, log, box, child_env(args.autotune))
    text = log.read_text(errors="replace") if log.exists() else ""
    counts = _pytest_counts(text)
    result: dict[str, Any] = {"command": " ".join(["python", *cmd[1:]]), "seconds": round(seconds, 1),
                              "log": str(log), "exit_code": rc, "counts": counts, "output_tail": tail(text, TAIL_LINES)}
    if rc is None:
        result.update(status="failed", reason=f"timed out after {box:.0f} s")
    elif rc == 0:
        result.update(status="ok")
    elif rc == 5:  # pytest: nothing selected
        result.update(status="ok", reason="no test carries the gpu mark here")
    else:
        failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        result.update(status="failed", reason=f"pytest exit code {rc}" + (f": {failed} failed" if failed else ""))
    return result


def _pytest_counts(text: str) -> dict[str, int]:
    """{"passed": 3, "skipped": 2, ...} from pytest's last summary line."""
    for line in reversed(text.splitlines()):
        found = re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed|warnings?)", line)
        if found and (" in " in line or "no tests ran" in line):
            return {kind: int(n) for n, kind in found}
    return {}


def bench_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The command line of phase e: the quick benchmark on the device, its results under ``out/bench``."""
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--device", args.device, "--out", str(out / "bench"),
           "--no-progress"]
    if args.tiny:  # one small case, no torch.compile, no memory pass: seconds on a CPU
        cmd += ["--cases", "decode_attention", "--compile-per-op", "0", "--no-memory", "--quick-peaks"]
    return cmd


def run_bench_phase(args: argparse.Namespace, box: float, logs: Path, out: Path) -> dict[str, Any]:
    """Phase e: the quick benchmark on the device, as a subprocess; its records summarised (the bench saves
    after every case, so a run stopped at the time box still shows what it measured)."""
    cmd = bench_command(args, out)
    log = logs / "e-bench.log"
    results_json = out / "bench" / "results.json"
    results_json.unlink(missing_ok=True)   # never read a previous run's results as this one's
    rc, seconds = run_process(cmd, log, box, child_env(args.autotune))
    result: dict[str, Any] = {"command": " ".join(["python", *cmd[1:]]), "seconds": round(seconds, 1),
                              "log": str(log), "exit_code": rc}
    bench: dict[str, Any] | None = None
    try:
        bench = json.loads(results_json.read_text()) if results_json.exists() else None
    except (OSError, json.JSONDecodeError) as exc:
        result["note"] = f"unreadable results.json: {exc}"
    failed_impls: list[str] = []
    if bench is not None:
        result["rows"] = summarise_bench(bench)
        result["skipped_impls"] = [f"{s.get('op')}/{s.get('case')} {s.get('mode')} {s.get('impl')}: {s.get('reason')}"
                                   for s in bench.get("skipped", [])]
        result["meta"] = {k: bench.get("meta", {}).get(k) for k in ("device", "dtype", "gemm_flops", "mem_bw")}
        failed_impls = [s for s in result["skipped_impls"] if ": failed" in s or "prepare failed" in s]
    measured = f"{len(result.get('rows', []))} (case, mode) pairs measured"
    if rc is None:
        result.update(status="failed", reason=f"timed out after {box:.0f} s ({measured})", error_tail=read_tail(log))
    elif rc != 0:
        result.update(status="failed", reason=f"exit code {rc} ({measured})", error_tail=read_tail(log))
    elif bench is None:
        result.update(status="failed", reason="the bench wrote no results.json", error_tail=read_tail(log))
    elif failed_impls:
        result.update(status="failed", reason=f"{len(failed_impls)} implementation(s) failed in the bench")
    else:
        result.update(status="ok")
    return result


def summarise_bench(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (case, mode): each implementation's median ms, fastqa's speedup over eager and compiled,
    and its share of the roofline bound."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in bench.get("records", []):
        row = rows.setdefault((r["op"], r["case"], r["mode"]), {"op": r["op"], "case": r["case"], "mode": r["mode"],
                                                               "ms": {}, "bound_ms": r.get("bound_ms")})
        row["ms"][r["impl"]] = r["median_ms"]
    for row in rows.values():
        fast = next((v for k, v in row["ms"].items() if k.startswith("fastqa")), None)
        row["fastqa_ms"] = fast
        row["vs_eager"] = row["ms"]["eager"] / fast if fast and "eager" in row["ms"] else None
        row["vs_compiled"] = row["ms"]["compiled"] / fast if fast and "compiled" in row["ms"] else None
        row["of_bound"] = row["bound_ms"] / fast if fast and row.get("bound_ms") else None
    return list(rows.values())
