"""Measurements: interleaved timing, peak memory, and the machine's GEMM FLOP/s and bandwidth; for the GPU
check (scripts/gpu_check) also a call's host-issue time and a CUDA graph's replay time.

Timing uses torch.utils.benchmark on the CPU (it pins the thread count) and CUDA events on the GPU.
Implementations are sampled round-robin, one sample each per round with the order rotated, so load
from other processes on a shared machine lands on all of them alike.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils import benchmark as tbench


@dataclass
class Settings:
    """How long to measure. ``target_s``: timed seconds per implementation and (case, mode), within
    [min_runs, max_runs] samples; ``min_sample_s``: fast calls are batched so that one sample lasts
    at least this long (timer overhead); warm-up: at least ``warmup_calls`` calls and ``warmup_s``."""
    min_runs: int = 10
    max_runs: int = 50
    target_s: float = 1.0
    min_sample_s: float = 2e-3
    warmup_calls: int = 2
    warmup_s: float = 0.2
    memory: bool = True


# One warm-up call: it is also the compile of torch.compile and the call whose result is checked.
QUICK = Settings(min_runs=10, max_runs=10, target_s=0.0, warmup_calls=1, warmup_s=0.0)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown CPU"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call_seconds(fn: Callable[[], Any], device: torch.device, number: int = 1) -> tuple[float, float]:
    """(seconds per call waited for, the host's seconds per call to issue it) over ``number`` back-to-back
    calls of a warm ``fn``. On a GPU the calls are bracketed by CUDA events and the host's time is how long
    the calls took to return (before the device finishes, unless something syncs): close to the first,
    the calls are bound by their launching, not by their kernels. On the CPU both are the wall time."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / number, host / number
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    wall = (time.perf_counter() - t0) / number
    return wall, wall


def graph_replay_seconds(fn: Callable[[], Any], device: torch.device, replays: int) -> float:
    """Seconds per replay of ``fn`` captured in a CUDA graph: the device's time with no host launching
    (CUDA only; a capture that breaks raises)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):   # the warm-up the capture needs, off the default stream
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    _sync(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / replays


def sampler(fn: Callable[[], Any], device: torch.device) -> Callable[[int], float]:
    """A function ``number -> seconds per call`` timing ``number`` back-to-back calls of ``fn``."""
    if device.type == "cuda":
        return lambda number: call_seconds(fn, device, number)[0]
    # torch's Timer on the CPU: it pins the thread count for the measurement.
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return lambda number: timer.timeit(number).mean


def time_interleaved(fns: dict[str, Callable[[], Any]], device: torch.device, settings: Settings,
                     est_s: dict[str, float], on_round: Callable[[int, int], None] | None = None
                     ) -> dict[str, list[float]]:
    """Seconds per call of each (warmed-up) fn, sampled round-robin. ``est_s``: a warm call's time."""
    if not fns:
        return {}
    number = {k: max(1, math.ceil(settings.min_sample_s / max(est_s[k], 1e-9))) for k in fns}
    slowest = max(est_s[k] * number[k] for k in fns)
    rounds = min(settings.max_runs, max(settings.min_runs, int(settings.target_s / max(slowest, 1e-9))))
    samplers = {k: sampler(fn, device) for k, fn in fns.items()}
    names = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            samples[k].append(samplers[k](number[k]))
        if on_round:
            on_round(r + 1, rounds)
    return samples


def quantiles_ms(samples: list[float]) -> tuple[float, float, float]:
    """(median, p25, p75) in milliseconds."""
    t = torch.tensor(samples, dtype=torch.float64) * 1e3
    q = torch.quantile(t, torch.tensor([0.5, 0.25, 0.75], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence fd 2 (the profiler's C++ start/stop lines) for the duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Peak bytes allocated by one call of ``fn`` above what was allocated before it (outputs included).

    GPU: torch.cuda.max_memory_allocated. CPU: torch.profiler's allocation trace -- every [memory]
    event (bytes allocated > 0, freed < 0) replayed in time order; the peak of the running sum.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = fn()
        torch.cuda.synchronize(device)
        del result
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    # The raw kineto events: the parsed function events fold allocations into their ops.
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where torch's oneDNN linear op (``torch.ops.mkldnn._linear_pointwise``) runs ``dtype``:
    the second CPU GEMM engine, next to MKL/OpenBLAS behind ``torch.mm``."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def machine_peaks(device: torch.device, dtype: torch.dtype, *, quick: bool = False) -> dict[str, float]:
    """Measured GEMM FLOP/s (square matmul of ``dtype``) and memory bandwidth (a large copy: read +
    write) -- the roofs of each case's lower bound. ``quick``: small sizes (a smoke test, not roofs).

    On the CPU the GEMM roof is the best engine on the machine: ``torch.mm`` (MKL/OpenBLAS) and, where
    torch has it, oneDNN (``torch.ops.mkldnn._linear_pointwise``, what eager ``conv1d`` and the fastqa
    kernels may run on); on an AMD processor oneDNN can be twice MKL. Both rates are returned
    (``gemm_flops_blas``, ``gemm_flops_onednn``), ``gemm_flops`` is their max."""
    n = 256 if quick else 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    numel = 2 ** 20 if quick else 2 ** 28 if device.type == "cuda" else 2 ** 25
    src = torch.empty(numel, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    fns: dict[str, Callable[[], Any]] = {"gemm": lambda: torch.mm(a, b), "copy": lambda: dst.copy_(src)}
    if onednn_linear_available(device, dtype):
        b_t = b.t().contiguous()  # nn.Linear's [out, in] layout
        fns["gemm_onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b_t, None, "none", [], None)
    for f in fns.values():  # warm-up: thread pools, allocator, clocks
        for _ in range(3):
            f()
        _sync(device)
    quick = Settings(min_runs=10, max_runs=20, target_s=0.5, min_sample_s=0.0)
    samples = time_interleaved(fns, device, quick, est_s={k: 1e-3 for k in fns})
    # The best sample: a roof is what the machine can do, not what it did under load.
    flop = 2.0 * n ** 3
    peaks = {"gemm_flops_blas": flop / min(samples["gemm"]),
             "mem_bw": 2.0 * src.numel() * src.element_size() / min(samples["copy"])}
    if "gemm_onednn" in samples:
        peaks["gemm_flops_onednn"] = flop / min(samples["gemm_onednn"])
    peaks["gemm_flops"] = max(v for k, v in peaks.items() if k.startswith("gemm_flops_"))
    return peaks
