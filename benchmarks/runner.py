"""Runs registered cases into result records: one per (op, case, impl, mode)."""
from __future__ import annotations

import datetime
import importlib
import platform
import sys
import time
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm

from . import measure
from .registry import Case, Prepared, max_abs_err


def versions() -> dict[str, str | None]:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # absent or broken: recorded as such
        triton_version = None
    try:
        import fastqa
        fastqa_version = fastqa.__version__
    except Exception as exc:
        fastqa_version = f"unimportable: {exc}"
    return {"torch": torch.__version__, "triton": triton_version, "fastqa": fastqa_version}


def ask_fastqa(name: str) -> Any:
    """``fastqa._backend.<name>()`` (e.g. the CPU GEMM engine and its rates, the GLU algorithm setting), or
    ``{"error": ...}`` where fastqa cannot answer: recorded, never fatal to a benchmark run."""
    try:
        return getattr(importlib.import_module("fastqa._backend"), name)()
    except Exception as exc:
        return {"error": _short(exc)}


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) < 160 else text[:157] + "..."


def _warm_up(fn: Callable[[], Any], settings: measure.Settings, device: torch.device) -> tuple[Any, float, float]:
    """Call ``fn`` until warm; returns (last result, first call's seconds, last call's seconds)."""
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        result = fn()
        measure._sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= settings.warmup_calls and time.perf_counter() - start >= settings.warmup_s:
            return result, times[0], times[-1]


def run_case_mode(case: Case, mode: str, prepared: Prepared, device: torch.device, dtype: torch.dtype,
                  settings: measure.Settings, peaks: dict[str, float], skipped: list[dict],
                  status: Callable[[str], None]) -> list[dict]:
    """Warm up, check, time (interleaved) and measure the memory of every implementation of one
    prepared (case, mode); failures go to ``skipped`` instead of stopping the run."""
    def skip(impl: str, reason: str) -> None:
        skipped.append({"op": case.op, "case": case.name, "mode": mode, "impl": impl, "reason": reason})

    for impl, reason in prepared.unavailable.items():
        skip(impl, reason)
    live: dict[str, Callable[[], Any]] = {}
    first_s: dict[str, float] = {}
    est_s: dict[str, float] = {}
    errors: dict[str, float] = {}
    for impl, fn in prepared.runners.items():
        status(f"{'compiling' if impl in prepared.compiled else 'warming up'} {impl}")
        try:
            result, first_s[impl], est_s[impl] = _warm_up(fn, settings, device)
            errors[impl] = max_abs_err(result, prepared.expected_of(impl))
        except Exception as exc:  # a broken implementation is reported, the others still run
            skip(impl, f"failed: {_short(exc)}")
            continue
        del result
        live[impl] = fn
    samples = measure.time_interleaved(live, device, settings, est_s,
                                       on_round=lambda r, n: status(f"timing {r}/{n}"))
    bound_ms = 1e3 * max(prepared.flops / peaks["gemm_flops"], prepared.bytes / peaks["mem_bw"])
    records = []
    for impl, fn in live.items():
        status(f"memory {impl}")
        median, p25, p75 = measure.quantiles_ms(samples[impl])
        records.append({
            "op": case.op, "case": case.name, "shape": case.shape, "impl": impl, "mode": mode,
            "median_ms": median, "p25_ms": p25, "p75_ms": p75, "runs": len(samples[impl]),
            "peak_mem_bytes": measure.peak_memory(fn, device) if settings.memory else None,
            "max_abs_err": errors[impl], "baseline": prepared.baseline, "bound_ms": bound_ms, "bound_ratio": median / bound_ms,
            "compile_s": first_s[impl] if impl in prepared.compiled else None,
            "flops": prepared.flops, "bytes": prepared.bytes, "dtype": str(dtype).replace("torch.", ""),
            "device": measure.device_name(device), **versions(),
        })
    return records


def run(cases: Sequence[Case], *, device: torch.device, dtype: torch.dtype, settings: measure.Settings,
        compile_per_op: int | None = None, naive_limit_bytes: float = 4 * 2 ** 30,
        progress: bool = True, peaks: dict[str, float] | None = None,
        on_case: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run ``cases`` (every mode of each) and return ``{"meta": ..., "records": [...], "skipped": [...]}``.

    compile_per_op: how many (case, mode) pairs of each op include torch.compile (None: all) --
    compiling costs tens of seconds per graph on a small CPU. peaks: the roofs (``gemm_flops``,
    ``mem_bw``), measured now when not given. on_case: called with the result so far after every (case,
    mode), e.g. to save it, so that a run stopped by a time limit still leaves what it measured.
    """
    peaks = peaks or measure.machine_peaks(device, dtype)
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(), "device": measure.device_name(device), "device_type": device.type,
        "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
        "python": platform.python_version(), **versions(), **peaks,
        "cpu_gemm": ask_fastqa("cpu_gemm_info") if device.type == "cpu" else None,
        "cpu_glu_conv": ask_fastqa("cpu_glu_conv") if device.type == "cpu" else None,
        "settings": vars(settings), "compile_per_op": compile_per_op, "argv": sys.argv[1:],
    }
    records: list[dict] = []
    skipped: list[dict] = []
    pairs = [(c, m) for c in cases for m in c.modes]
    compiled_per_op: dict[str, int] = {}
    bar = tqdm(pairs, desc="bench", unit="case", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    for case, mode in bar:
        def status(text: str) -> None:
            bar.set_postfix_str(f"{case.id} {mode}: {text}", refresh=True)
        n_compiled = compiled_per_op.get(case.op, 0)
        compile = compile_per_op is None or n_compiled < compile_per_op
        if compile:
            compiled_per_op[case.op] = n_compiled + 1
            torch._dynamo.reset()  # fresh compile caches: no recompile limits across cases
        status("preparing")
        try:
            prepared = case.prepare(mode, device, dtype, compile=compile, naive_limit_bytes=naive_limit_bytes)
        except Exception as exc:
            skipped.append({"op": case.op, "case": case.name, "mode": mode, "impl": "*",
                            "reason": f"prepare failed: {_short(exc)}"})
            continue
        if not compile:
            prepared.unavailable.setdefault("compiled", "not compiled in this run (see --compile-per-op)")
        records += run_case_mode(case, mode, prepared, device, dtype, settings, peaks, skipped, status)
        del prepared
        if on_case is not None:
            on_case({"meta": meta, "records": records, "skipped": skipped, "partial": True})
    bar.close()
    return {"meta": meta, "records": records, "skipped": skipped}
