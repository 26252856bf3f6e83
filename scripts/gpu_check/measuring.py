"""Measuring inside the phase children: a step's time through ``benchmarks.measure`` (each call waited for, and
the host's time to issue it), and what the benchmark does not take: host syncs and kernel launches per call, a
host profile, the peak memory of a whole step. Imported by the children only (it imports torch)."""
from __future__ import annotations

import cProfile
import io
import pstats
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from benchmarks.measure import _sync, call_seconds, quantiles_ms

from .common import REPO, short_error


def time_steps(fn: Callable[[], Any], device: torch.device, steps: int) -> dict[str, float]:
    """Milliseconds per call of a warm ``fn`` over ``steps`` calls, each waited for: median, min, max; on a GPU
    also ``host_ms``, the host's median time to issue one call."""
    samples = [call_seconds(fn, device) for _ in range(steps)]
    waited = [s for s, _ in samples]
    out = {"median_ms": quantiles_ms(waited)[0], "min_ms": min(waited) * 1e3, "max_ms": max(waited) * 1e3,
           "runs": len(waited)}
    if device.type == "cuda":
        # Close to median_ms means the step is bound by launching, not by the kernels. On the CPU the host's
        # time is the call's time: nothing to tell apart.
        out["host_ms"] = quantiles_ms([h for _, h in samples])[0]
    return out


def host_profile(fn: Callable[[], Any], device: torch.device, calls: int, top: int = 18) -> list[str]:
    """Where the host's time goes in ``calls`` calls of a warm ``fn``: cProfile's functions by own time."""
    _sync(device)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    _sync(device)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    lines = [line.rstrip() for line in text.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return [f"{calls} calls: " + next((line.strip() for line in lines if "function calls" in line), "")] + \
        [line.replace(str(REPO) + "/", "") for line in lines[start:]]


def count_host_syncs(fn: Callable[[], Any], device: torch.device) -> dict[str, Any] | None:
    """Host synchronisations in one call of ``fn`` (CUDA only): torch's sync debug mode warns at every op
    that makes the host wait for the device (``.item()``, ``nonzero``, a device-to-host copy, ...); the
    warnings are counted, with the Python lines that caused the most."""
    if device.type != "cuda":
        return None
    _sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _sync(device)
    hits = [w for w in caught if "synchroniz" in str(w.message).lower()]
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in hits)
    return {"count": len(hits), "sites": [f"{site} x{n}" for site, n in sites.most_common(5)]}


def classify_device_events(names: Sequence[str]) -> dict[str, Any]:
    """Device-side profiler events by kind: kernels, memory copies, memsets (sync and wait markers are
    left out); ``top``: the most frequent kernel names."""
    kernels: Counter[str] = Counter()
    copies = memsets = 0
    for name in names:
        low = name.lower()
        if low.startswith("memcpy"):
            copies += 1
        elif low.startswith("memset"):
            memsets += 1
        elif "sync" in low or "wait" in low:
            continue
        else:
            kernels[name] += 1
    return {"kernels": sum(kernels.values()), "memcpy": copies, "memset": memsets,
            "top": [f"{name[:80]} x{n}" for name, n in kernels.most_common(8)]}


def count_kernels(fn: Callable[[], Any], device: torch.device) -> dict[str, Any] | None:
    """Kernels launched by one call of ``fn`` (CUDA only), read off torch.profiler's device events."""
    from torch.profiler import ProfilerActivity, profile
    if device.type != "cuda":
        return None
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    cuda = torch.autograd.DeviceType.CUDA
    try:
        names = [e.name() for e in prof.profiler.kineto_results.events() if e.device_type() == cuda]
    except AttributeError:  # a torch whose kineto results are not exposed: the parsed events carry the same
        names = [e.name for e in prof.events() if e.device_type == cuda]
    return classify_device_events(names)


def counted(counter: Callable[[Callable[[], Any], torch.device], dict[str, Any] | None], fn: Callable[[], Any],
            device: torch.device) -> dict[str, Any] | None:
    """``counter(fn, device)``, or ``{"error": ...}`` where the counting itself breaks (the profiler, the sync
    debug mode): the timings measured before it are kept either way."""
    try:
        return counter(fn, device)
    except Exception as exc:
        return {"error": short_error(exc)}


def reset_peak_memory(device: torch.device) -> None:
    """Start a peak-memory reading (CUDA only): the cache emptied, the peak set to what is allocated now."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """The most the device had allocated since ``reset_peak_memory``, weights and optimizer state included
    (what a run of the model needs, unlike ``benchmarks.measure.peak_memory``'s one call above what was there)."""
    return round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2) if device.type == "cuda" else None


def first_call(run: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """(the result of a first call of ``run``, its seconds, waited for): a compile, a Triton JIT, cuBLAS handles."""
    t0 = time.perf_counter()
    result = run()
    _sync(device)
    return result, time.perf_counter() - t0


def measure_step(run: Callable[[], Any], device: torch.device, *, warmup: int, steps: int) -> dict[str, Any]:
    """What phases c and d record of a step: the first call's seconds, ms/step after ``warmup`` calls, host
    syncs and kernels per step, peak memory, and the first call's loss where the step returns one."""
    reset_peak_memory(device)
    first, seconds = first_call(run, device)
    out: dict[str, Any] = {"first_call_s": round(seconds, 3)}
    for _ in range(max(0, warmup - 1)):
        run()
    _sync(device)
    out.update(time_steps(run, device, steps))
    out["peak_gib"] = peak_memory_gib(device)
    out["host_syncs"] = counted(count_host_syncs, run, device)
    out["launches"] = counted(count_kernels, run, device)
    if isinstance(first, tuple) and first and hasattr(first[0], "numel") and first[0].numel() == 1:
        out["loss"] = float(first[0])
    elif hasattr(first, "numel") and first.numel() == 1:
        out["loss"] = float(first)
    return out
