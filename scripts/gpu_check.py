#!/usr/bin/env python
"""``make gpu-check``: prove the GPU path in one unattended command and write what it found.

    scripts/gpu_check.sh OUT [ARGS]                                # on a GPU image: no venv, no build (make gpu-check)
    python scripts/gpu_check.py --out gpu-check-results            # the same phases, fastqa importable already
    python scripts/gpu_check.py --tiny --out /tmp/gc               # every phase on tiny shapes (CPU is fine)
    python scripts/gpu_check.py --phases b,c --budget-s 200        # some phases, a smaller global budget

Writes ``summary.txt`` and ``summary.json`` under ``--out`` (rewritten after every phase, so a run cut
short still leaves what it did), the phases' logs under ``--out/logs`` and the benchmark's results under
``--out/bench``. The header gives the versions (Python, torch, Triton, CUDA, ``fastqa.info()``) and the
device; then the phases, in the order of what they are worth:

  b  every op against the float64 reference (``fastqa.reference`` in float64 on the same device), fp32
     and bf16, at the models' shapes: max abs and relative error of the output and every gradient, and
     eager PyTorch's own error in the same dtype beside it
  f  per op, fastqa against eager: ms per call, the host's ms to issue it, and the kernels alone (a CUDA
     graph replayed): whether an op is bound by its launching or by its kernels
  c  QANet ``paper`` B32 train step and inference: fast layers vs reference layers vs torch.compile of
     the reference model, bf16 autocast and fp32: ms/step, the host's share, host syncs and kernel
     launches per step, and a host profile of the fast bf16 step
  d  ConvS2S ``tutorial``: train step, greedy and beam-5 translation of 200 generated sentences
     (incremental vs full recompute), sentences/s
  e  ``python -m benchmarks --quick`` on the device
  a  the GPU test classes: ``pytest -m gpu tests/ops -q -x`` (``-n`` when pytest-xdist is there)

Every phase runs in a process of its own (a CUDA error poisons the process that meets it, and a hung
kernel or compile can only be stopped from outside) under a time box: its budget, plus whatever the
global budget (``--budget-s``) has left over the later phases' budgets; a phase given its own
``--phase-budget`` gets exactly that. A phase whose box is under the least it needs is skipped with a
note; a phase that fails or overruns records what it finished and its error tail, and the run goes on.
Inside phases b, c, d and f each measured item is checked against the clock too, and items that do not
fit are recorded as skipped. The script exits 0 whatever the phases found (the summary says it), so a
command chained after it still runs. Triton kernels run their first configuration unless ``--autotune``.

``--tiny`` shrinks every shape and step count so that all phases run in seconds on a CPU (the device is
the CPU when there is no GPU): the test suite runs it.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import inspect
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the benchmarks package and an uninstalled fastqa live here
    sys.path.insert(0, str(REPO))

# A first device run's command: a lent GPU gives 15 minutes in all, its start included, and one command
# at most 10; this leaves time to run the check again after a fix.
GLOBAL_BUDGET_S = 400.0
# Pass/fail of phase b: max |got - ref| / max |ref| per tensor, ref = the float64 reference on the same
# (rounded) inputs. fp32 kernels accumulate in fp32 (Triton dots in tf32x3): far under 1e-4; bf16 rounds
# every stored intermediate to 8 mantissa bits.
TOLERANCES = {"float32": 1e-4, "bfloat16": 2e-2}
# ... or at most this many times eager PyTorch's error in the same dtype against the same float64 reference.
EAGER_FACTOR = 2.0
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
# A child gets this long after its time box to write its results and let CUDA shut down, before it is killed.
KILL_GRACE_S = 10.0
TAIL_LINES = 40


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase: its key (``--phases``), what it does, and its time figures (seconds): ``budget_s`` /
    ``tiny_budget_s`` its time box before any slack, ``min_s`` / ``tiny_min_s`` the least worth starting."""
    key: str
    title: str
    budget_s: float
    tiny_budget_s: float
    min_s: float
    tiny_min_s: float


# In the order of what they are worth: a first device run that is cut short still proves the kernels.
PHASES: tuple[Phase, ...] = (
    Phase("b", "every op vs its float64 reference, fp32 + bf16, model shapes", 110.0, 60.0, 20.0, 2.0),
    Phase("f", "launching vs kernels: per op, fastqa vs eager, CUDA-graph replay, bf16", 30.0, 30.0, 10.0, 2.0),
    Phase("c", "QANet paper B32: fast vs reference vs compiled, bf16 + fp32", 100.0, 90.0, 30.0, 2.0),
    Phase("d", "ConvS2S tutorial: train step, greedy + beam-5 translation", 50.0, 60.0, 20.0, 2.0),
    Phase("e", "python -m benchmarks --quick", 50.0, 60.0, 30.0, 2.0),
    Phase("a", "GPU tests: pytest -m gpu tests/ops", 50.0, 60.0, 20.0, 2.0),
)
PHASE_KEYS = tuple(p.key for p in PHASES)


# ==================================================================================================
# Shared helpers (parent and children)
# ==================================================================================================

def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def read_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError as exc:
        return f"(no log: {exc})"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON through a temporary file, so a reader (or a kill) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str, allow_nan=True))
    os.replace(tmp, path)


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def fmt_num(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# ==================================================================================================
# The environment header
# ==================================================================================================

def _run_quiet(cmd: Sequence[str], timeout: float = 10.0) -> str | None:
    """First lines of a tool's output (nvcc, nvidia-smi, git), or None where it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def collect_environment(device_arg: str) -> dict[str, Any]:
    """Versions, device and build: what the header of the summary shows. Never raises: a part that cannot
    be read says why."""
    env: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                           "platform": platform.platform(), "cpus": os.cpu_count(), "host": platform.node()}
    try:
        import torch
    except Exception as exc:  # without torch nothing else can run; the header says so
        env["torch_error"] = short_error(exc)
        return env
    env["torch"] = torch.__version__
    env["cuda_runtime"] = torch.version.cuda
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as exc:  # absent or broken: the Triton phases then fail and say why
        env["triton"] = None
        env["triton_error"] = short_error(exc)
    device = torch.device(device_arg)
    dev: dict[str, Any] = {"type": device.type}
    if device.type == "cuda":
        try:
            props = torch.cuda.get_device_properties(device)
            dev.update(name=props.name, capability=f"sm_{props.major}{props.minor}",
                       multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2 ** 30, 1))
        except Exception as exc:
            dev["error"] = short_error(exc)
        dev["driver"] = _run_quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        nvcc = _run_quiet(["nvcc", "--version"])
        dev["nvcc"] = nvcc.splitlines()[-1] if nvcc else None
        env["matmul_tf32"] = torch.backends.cuda.matmul.allow_tf32
        env["cudnn_tf32"] = torch.backends.cudnn.allow_tf32
    else:
        try:
            from benchmarks.measure import device_name
            dev["name"] = device_name(device)
        except Exception as exc:
            dev["name"] = f"{platform.processor() or 'CPU'} (benchmarks.measure unimportable: {short_error(exc)})"
        dev["threads"] = torch.get_num_threads()
    env["device"] = dev
    try:
        import fastqa
        env["fastqa"] = fastqa.info()
    except Exception as exc:
        env["fastqa"] = {"error": short_error(exc)}
    rev = _run_quiet(["git", "rev-parse", "--short", "HEAD"])
    if rev:
        dirty = _run_quiet(["git", "status", "--porcelain", "--untracked-files=no"])
        env["git"] = rev + (" (with uncommitted changes)" if dirty else "")
    return env


def environment_lines(env: dict[str, Any]) -> list[str]:
    dev = env.get("device", {})
    if dev.get("type") == "cuda" and dev.get("error"):
        dev_line = f"CUDA device unreadable: {dev['error']}"
    elif dev.get("type") == "cuda":
        dev_line = (f"{dev.get('name', '?')} ({dev.get('capability', '?')}, {dev.get('multiprocessors', '?')} SMs, "
                    f"{dev.get('memory_gib', '?')} GiB; driver {dev.get('driver') or '?'}; {dev.get('nvcc') or 'no nvcc'})")
    else:
        dev_line = f"{dev.get('name', '?')} (CPU, {dev.get('threads', '?')} torch threads)"
    fq = env.get("fastqa", {})
    if "error" in fq:
        fq_line = f"unimportable: {fq['error']}"
    else:
        backends = ", ".join(k for k, v in fq.get("backends", {}).items() if v)
        ext = fq.get("cpu_extension") or {}
        fq_line = (f"{fq.get('fastqa')}: backends {backends}; C++ extension "
                   + (f"built ({ext.get('simd')})" if ext else f"missing ({fq.get('cpu_extension_error')})"))
    cuda = (f"CUDA {env.get('cuda_runtime')}, cuDNN {env.get('cudnn')}" if env.get("cuda_runtime") else "no CUDA")
    lines = [f"device   : {dev_line}",
             f"versions : Python {env.get('python')}, torch {env.get('torch', env.get('torch_error'))} ({cuda}), "
             f"Triton {env.get('triton') or 'not installed'}",
             f"fastqa   : {fq_line}"]
    if "matmul_tf32" in env:
        lines.append(f"settings : torch matmul TF32 {env['matmul_tf32']}, cuDNN TF32 {env['cudnn_tf32']} (phase b turns both off)")
    if env.get("git"):
        lines.append(f"source   : git {env['git']}")
    return lines


# ==================================================================================================
# Measuring (children)
# ==================================================================================================

class TimeBoxSpent(BaseException):
    """Raised by the alarm at a child's deadline. A BaseException, so that no ``except Exception`` inside
    torch or fastqa swallows it."""


def _sync(device: Any) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(fn: Callable[[], Any], device: Any, steps: int) -> dict[str, float]:
    """Milliseconds per call of a warm ``fn`` over ``steps`` calls: median, min, max. On a GPU each call is
    bracketed by CUDA events and waited for, so a call's time includes its host-side launching."""
    import torch
    times, host = [], []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    out = {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": len(times)}
    if host:
        # The host's time to issue one call (it returns before the device finishes unless something syncs):
        # close to median_ms means the step is bound by launching, not by the kernels.
        out["host_ms"] = statistics.median(host)
    return out


def host_profile(fn: Callable[[], Any], device: Any, calls: int, top: int = 18) -> list[str]:
    """Where the host's time goes in ``calls`` calls of a warm ``fn``: cProfile's functions by own time."""
    import cProfile
    import io
    import pstats
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


def count_host_syncs(fn: Callable[[], Any], device: Any) -> dict[str, Any] | None:
    """Host synchronisations in one call of ``fn`` (CUDA only): torch's sync debug mode warns at every op
    that makes the host wait for the device (``.item()``, ``nonzero``, a device-to-host copy, ...); the
    warnings are counted, with the Python lines that caused the most."""
    import torch
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


def count_kernels(fn: Callable[[], Any], device: Any) -> dict[str, Any] | None:
    """Kernels launched by one call of ``fn`` (CUDA only), read off torch.profiler's device events."""
    import torch
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


def counted(counter: Callable[[Callable[[], Any], Any], dict[str, Any] | None], fn: Callable[[], Any],
            device: Any) -> dict[str, Any] | None:
    """``counter(fn, device)``, or ``{"error": ...}`` where the counting itself breaks (the profiler, the sync
    debug mode): the timings measured before it are kept either way."""
    try:
        return counter(fn, device)
    except Exception as exc:
        return {"error": short_error(exc)}


def peak_memory_gib(device: Any) -> float | None:
    import torch
    return round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2) if device.type == "cuda" else None


def reset_peak_memory(device: Any) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def measure_step(run: Callable[[], Any], device: Any, *, warmup: int, steps: int) -> dict[str, Any]:
    """What phases c and d record of a step: the first call's seconds (a compile, a Triton JIT), ms/step
    after ``warmup`` calls, host syncs and kernels per step, peak memory."""
    reset_peak_memory(device)
    t0 = time.perf_counter()
    first = run()
    _sync(device)
    out: dict[str, Any] = {"first_call_s": round(time.perf_counter() - t0, 3)}
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


class Recorder:
    """A child's results: one record per item (name, status ok / failed / skipped, reason, seconds,
    figures), written to ``path`` after every item so that a killed child still leaves what it measured."""

    def __init__(self, path: Path, deadline: float) -> None:
        self.path, self.deadline = path, deadline
        self.items: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.lost: str | None = None   # set once the device is unusable (a CUDA error): later items skip
        self.flush()

    def remaining(self) -> float:
        return self.deadline - time.time()

    def flush(self, done: bool = False) -> None:
        write_json_atomic(self.path, {"items": self.items, "info": self.info, "done": done})

    def item(self, name: str, fn: Callable[[], dict[str, Any]], *, min_s: float = 0.0, **labels: Any) -> dict[str, Any]:
        """Run ``fn`` (-> its figures; a ``failed`` key in them fails the item with that reason) and record it;
        skipped when the time box cannot fit ``min_s`` more or the device is lost."""
        record: dict[str, Any] = {"name": name, **labels}
        left = self.remaining()
        if self.lost:
            record.update(status="skipped", reason=f"not run: {self.lost}")
        elif left < max(min_s, 0.5):
            record.update(status="skipped", reason=f"phase time box spent ({left:.0f} s left, item needs ~{min_s:.0f} s)")
        else:
            print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
            t0 = time.perf_counter()
            try:
                figures = fn()
                reason = figures.pop("failed", None)
                record.update(figures)
                record["status"] = "failed" if reason else "ok"
                if reason:
                    record["reason"] = reason
            except TimeBoxSpent:
                record.update(status="skipped", reason="phase time box ran out during this item")
            except Exception as exc:
                text = traceback.format_exc()
                record.update(status="failed", reason=short_error(exc), error_tail=tail(text, 25))
                print(text, flush=True)
                if _device_lost(exc):
                    self.lost = f"the device failed earlier ({short_error(exc)})"
            record["seconds"] = round(time.perf_counter() - t0, 2)
            print(f"    -> {record['status']}" + (f": {record.get('reason')}" if record.get("reason") else ""), flush=True)
        self.items.append(record)
        self.flush()
        return record


def _device_lost(exc: BaseException) -> bool:
    """True for errors after which the CUDA context is unusable (every later CUDA call fails alike)."""
    text = str(exc)
    return any(s in text for s in ("illegal memory access", "CUDA error: unspecified launch failure",
                                   "device-side assert", "CUDA error: an illegal instruction"))


@dataclasses.dataclass
class Ctx:
    """What a phase child knows: its device, whether it is tiny, the torch.compile backend."""
    device: Any
    tiny: bool
    compile_backend: str


# --------------------------------------------------------------------------------------------------
# Phase b: every op against the float64 reference
# --------------------------------------------------------------------------------------------------

def op_cases(tiny: bool) -> list[Any]:
    """The op checks at the models' shapes (QANet: B32, context 400, question 50, d 128, kernels 7 and 5,
    8 heads; ConvS2S: B64, T 30, H 512, embedding 256, vocabulary 5893, beam 5), built with the benchmark's
    case constructors. The first case of each op comes first, so a short time box still covers every op."""
    from benchmarks import cases as bc

    if tiny:
        B, n, m, d, h, res_in = 2, 12, 5, 8, 2, 12
        Bt, T, H, E, V, beam = 2, 6, 8, 8, 37, 2
        packed = (5, 7, 4)
    else:
        B, n, m, d, h, res_in = 32, 400, 50, 128, 8, 500
        Bt, T, H, E, V, beam = 64, 30, 512, 256, 5893, 5
        # a packed batch of contexts: the lengths a padded B32 batch of 400 leaves (uniform in [200, 400])
        packed = tuple(200 + (37 * i) % 201 for i in range(B))
    first = [
        bc.dwsep_case(B, n, d, d, 7, relu_residual=True),             # QANet embedding encoder conv, context
        bc.ln_dwsep_case(B, n, d, 7),                                 # its whole sublayer, LayerNorm fused
        bc.trilinear_case(B, n, m, d),
        bc.cqa_case(B, n, m, d),
        bc.self_attention_case(B, n, d, h),
        bc.dropout_add_case(B, n, d),
        bc.linear_case((B, n), d, d, what="ffn"),
        bc.glu_case(Bt, H, T, 3, causal=True),                         # ConvS2S decoder
        bc.glu_step_case(Bt, H, 3, steps=T),                           # ... incremental decoding
        bc.decode_attention_case(Bt, beam, T, E),                      # a beam step's attention
        bc.linear_argmax_case(Bt * beam, E, V),                        # greedy / beam next token
    ]
    more = [
        bc.glu_case(Bt, H, T, 3, causal=False),                        # ConvS2S encoder (padding masked)
        bc.dwsep_case(B, n, d, d, 5, relu_residual=True),             # QANet model encoder conv
        bc.ln_dwsep_case(B, n, d, 5),
        bc.dwsep_case(B, m, d, d, 7, relu_residual=True),             # question side
        bc.dwsep_case(B, n, res_in, d, 5, relu_residual=False),       # [word; char] -> d resize
        bc.self_attention_case(B, m, d, h),
        bc.packed_self_attention_case(packed, d, h),
        bc.linear_case((Bt, T), E, V, what="vocab"),                   # ConvS2S output projection, training
    ]
    return first + more


def _param_names(fn: Callable) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _evaluate(fn: Callable, inputs: Any, with_grads: bool, grad_out: Any, names: list[str]) -> dict[str, Any]:
    """{"out": fn's output} plus {"grad_<input>": ...} of every differentiable input when ``with_grads``."""
    import torch
    if not with_grads:
        with torch.no_grad():
            return {"out": fn(*inputs.args, **inputs.kwargs)}

    def leaf(key: int | str, a: Any) -> Any:
        return a.detach().requires_grad_(key in inputs.grad) if isinstance(a, torch.Tensor) else a
    args = [leaf(i, a) for i, a in enumerate(inputs.args)]
    kwargs = {k: leaf(k, v) for k, v in inputs.kwargs.items()}
    leaves = [args[g] if isinstance(g, int) else kwargs[g] for g in inputs.grad]
    out = fn(*args, **kwargs)
    grads = torch.autograd.grad(out, leaves, grad_out)
    result = {"out": out.detach()}
    for key, g in zip(inputs.grad, grads):
        label = key if isinstance(key, str) else (names[key] if key < len(names) else f"arg{key}")
        result[f"grad_{label}"] = g
    return result


def _compare(got: Any, want: Any, floor: float) -> dict[str, Any]:
    """max |got - want|, that over max(max |want|, ``floor``) (the relative error), and whether ``got`` is
    finite. The floor keeps a tensor that is zero in exact arithmetic (the context-query attention's bias
    gradient: a constant added before a softmax) from turning rounding noise into a huge relative error."""
    g, w = got.detach().double(), want.detach().double().to(got.device)
    if g.shape != w.shape:
        raise ValueError(f"shape {tuple(g.shape)} != the reference's {tuple(w.shape)}")
    if not g.numel():
        return {"max_abs": 0.0, "rel": 0.0, "finite": True}
    max_abs = float((g - w).abs().max())
    scale = max(float(w.abs().max()), floor)
    return {"max_abs": max_abs, "rel": max_abs / scale if scale > 0 else max_abs,
            "finite": bool(g.isfinite().all())}


def _argmax_errors(ref_inputs: Any, picked: Any) -> dict[str, Any]:
    """linear_argmax: how much worse (in float64 logits) the picked token is than the best one, over the
    largest logit: a near tie may pick either token; a wrong pick shows as a gap."""
    import torch
    from fastqa import reference
    x, w, b = ref_inputs.args
    logits = reference.linear(x, w, b)
    exclude = list(ref_inputs.kwargs.get("exclude") or [])
    if exclude:
        logits[..., exclude] = float("-inf")
    best, best_idx = logits.max(dim=-1)
    chosen = logits.gather(-1, picked.long().unsqueeze(-1)).squeeze(-1)
    gap = best - chosen
    scale = float(logits[torch.isfinite(logits)].abs().max())
    max_gap = float(gap.max()) if gap.numel() else 0.0
    return {"max_abs": max_gap, "rel": max_gap / scale if scale > 0 else max_gap, "finite": math.isfinite(max_gap),
            "mismatch_fraction": float((picked.long() != best_idx).double().mean())}


def check_op(case: Any, dtype_name: str, device: Any) -> dict[str, Any]:
    """Run ``fastqa.<op>`` (backend auto) on the case's inputs rounded to ``dtype``, and the reference in
    float64 on the same rounded inputs and device; compare the output and every input gradient."""
    import torch

    import fastqa
    from fastqa import _backend

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    base = case.make_inputs(gen)
    inputs = base.to(device, dtype)
    ref_inputs = inputs.to(device, torch.float64)   # exact: every value is representable in float64
    names = _param_names(case.reference)
    with_grads = "fwd+bwd" in case.modes
    fast_fn = case.program(getattr(fastqa, case.fastqa_fn))
    ref_fn = case.program(case.reference)
    grad_out = grad_out64 = None
    if with_grads:
        with torch.no_grad():
            shape = ref_fn(*ref_inputs.args, **ref_inputs.kwargs).shape
        grad_out = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
        grad_out64 = grad_out.double()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = _backend.resolve_backend("auto", case.op, device, dtype)
        got = _evaluate(fast_fn, inputs, with_grads, grad_out, names)
    fallbacks = sorted({str(w.message)[:200] for w in caught if "fall" in str(w.message).lower()})
    want = _evaluate(ref_fn, ref_inputs, with_grads, grad_out64, names)
    # The same reference in the same dtype (eager PyTorch, rounding between its ops): the error a user of
    # the unfused op already accepts at this precision.
    eager = _evaluate(ref_fn, inputs, with_grads, grad_out, names)
    if case.op == "linear_argmax":
        tensors = {"out": _argmax_errors(ref_inputs, got["out"])}
        eager_tensors = {"out": _argmax_errors(ref_inputs, eager["out"])}
    else:
        # Every tensor is judged at its own scale, and never at less than the output's.
        floor = float(want["out"].detach().abs().max()) if want["out"].numel() else 0.0
        tensors = {k: _compare(got[k], want[k], floor) for k in want}
        eager_tensors = {k: _compare(eager[k], want[k], floor) for k in want}
    for k, v in tensors.items():
        if k in eager_tensors:
            v["eager_rel"] = eager_tensors[k]["rel"]
    tol = TOLERANCES[dtype_name]
    worst_name, worst = max(tensors.items(), key=lambda kv: kv[1]["rel"] if kv[1]["finite"] else math.inf)
    figures: dict[str, Any] = {"backend": backend, "fallback_warnings": fallbacks, "tensors": tensors,
                               "worst": worst_name, "worst_rel": worst["rel"], "tolerance": tol}
    if device.type == "cuda":
        figures["launches"] = counted(count_kernels, lambda: _evaluate(fast_fn, inputs, with_grads, grad_out, names),
                                      device)
    # A tensor passes under the tolerance, or within EAGER_FACTOR of eager PyTorch's own error in this dtype
    # (bf16 gradients through a ReLU: a pre-activation that rounds across zero flips its whole gradient).
    bad = [k for k, v in tensors.items()
           if not v["finite"] or v["rel"] > max(tol, EAGER_FACTOR * v.get("eager_rel", 0.0))]
    if bad:
        figures["failed"] = "over tolerance: " + ", ".join(
            (f"{k} rel {tensors[k]['rel']:.2e} (eager {tensors[k].get('eager_rel', math.nan):.2e})"
             if tensors[k]["finite"] else f"{k} not finite") for k in bad)
    return figures


def phase_ops(ctx: Ctx, rec: Recorder) -> None:
    """Phase b. Every tensor compared against the float64 reference on the same device, TF32 off (the
    references in float64 never use it; the kernels' fp32 is then compared with true fp32 arithmetic)."""
    import torch

    import fastqa
    if ctx.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cases = op_cases(ctx.tiny)
    covered = {c.op for c in cases}
    rec.info["ops_without_a_check"] = sorted(set(fastqa.ops.__all__) - covered)
    rec.info["tolerances"] = TOLERANCES
    for case in cases:
        for dtype_name in ("float32", "bfloat16"):
            rec.item(f"{case.id} {DTYPE_SHORT[dtype_name]}", functools.partial(check_op, case, dtype_name, ctx.device),
                     op=case.op, case=case.name, dtype=dtype_name)


# --------------------------------------------------------------------------------------------------
# Phase f: launching against computing
# --------------------------------------------------------------------------------------------------

def _graph_replay_ms(fn: Callable[[], Any], device: Any, replays: int) -> float:
    """Milliseconds per replay of ``fn`` captured in a CUDA graph: the device's time with no host launching."""
    import torch
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
    return start.elapsed_time(end) / replays


def launch_overhead(case: Any, dtype_name: str, device: Any, calls: int) -> dict[str, Any]:
    """One op case, forward and forward+backward, fastqa against eager PyTorch (the reference in the same
    dtype): ms per call waited for, the host's ms to issue it, and (forward) ms per CUDA-graph replay,
    i.e. the kernels alone. Where the first two are close and far above the third, the op is bound by its
    launching, not by its kernels. With a host profile of fastqa's forward+backward."""
    import torch

    import fastqa
    dtype = getattr(torch, dtype_name)
    inputs = case.make_inputs(torch.Generator().manual_seed(0)).to(device, dtype)
    names = _param_names(case.reference)
    impls = {"fastqa": case.program(getattr(fastqa, case.fastqa_fn)), "eager": case.program(case.reference)}
    with_grads = "fwd+bwd" in case.modes
    figures: dict[str, Any] = {}
    for label, fn in impls.items():
        def forward(fn=fn):
            with torch.no_grad():
                return fn(*inputs.args, **inputs.kwargs)
        forward()
        _sync(device)
        timed = time_steps(forward, device, calls)
        figures[f"{label}_fwd_ms"], figures[f"{label}_fwd_host_ms"] = timed["median_ms"], timed.get("host_ms")
        if device.type == "cuda":
            try:
                figures[f"{label}_fwd_graph_ms"] = _graph_replay_ms(forward, device, calls)
            except Exception as exc:  # a capture that breaks is a finding, not the end of the phase
                figures[f"{label}_fwd_graph_error"] = short_error(exc)
        if with_grads:
            grad_out = torch.randn(forward().shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
            both = functools.partial(_evaluate, fn, inputs, True, grad_out, names)
            both()
            _sync(device)
            timed = time_steps(both, device, calls)
            figures[f"{label}_fwdbwd_ms"], figures[f"{label}_fwdbwd_host_ms"] = timed["median_ms"], timed.get("host_ms")
            if label == "fastqa":
                figures["host_profile"] = host_profile(both, device, calls)
    return figures


def phase_overhead(ctx: Ctx, rec: Recorder) -> None:
    """Phase f: per op (the first case of each), fastqa vs eager: time per call, the host's share, and the
    kernels alone (CUDA-graph replay), bf16."""
    calls = 3 if ctx.tiny else 20
    seen: set[str] = set()
    for case in op_cases(ctx.tiny):
        if case.op in seen:
            continue
        seen.add(case.op)
        rec.item(f"{case.id} bf16 launching", functools.partial(launch_overhead, case, "bfloat16", ctx.device, calls),
                 op=case.op, case=case.name, dtype="bfloat16")


# --------------------------------------------------------------------------------------------------
# Phase c: QANet
# --------------------------------------------------------------------------------------------------

def phase_qanet(ctx: Ctx, rec: Recorder) -> None:
    """Phase c: the ``paper`` preset at B32 (context 400, question 50), train step and inference, with fast
    layers, reference layers and torch.compile of the reference model, under bf16 autocast and in fp32."""
    import torch

    from benchmarks import cases_qanet as cq

    device = ctx.device
    if ctx.tiny:
        cfg = cq.paper_config(word_dim=16, char_dim=8, char_channels=16, d_model=16, heads=2, emb_conv_layers=1,
                              model_blocks=1, model_conv_layers=1)
        B, n, m, W, steps, warmup = 2, 24, 8, 6, 1, 1
    else:
        cfg = cq.paper_config()
        B, n, m, W, steps, warmup = 32, 400, 50, cq.MAX_WORD_LEN, 10, 2
    rec.info.update(preset="tiny" if ctx.tiny else "paper", batch=B, context=n, question=m, steps=steps,
                    compile_backend=ctx.compile_backend)
    batch = {k: v.to(device) for k, v in cq.make_batch(torch.Generator().manual_seed(0), B, n, m, W).items()}
    models = cq.build_models(cfg, ["fast", "reference"], device, torch.float32)
    compiled: dict[str, Any] = {}

    def model_for(impl: str) -> Any:
        if impl != "compiled":
            return models[impl]
        if "model" not in compiled:
            # dynamic=False: the shapes never change here, and one static graph per (mode, precision) is
            # what a training run at a fixed batch shape gets.
            compiled["model"] = torch.compile(models["reference"], backend=ctx.compile_backend, dynamic=False)
        return compiled["model"]

    probabilities: dict[tuple[str, str], Any] = {}   # (precision, impl) -> eval-mode (p_start, p_end)

    def item(mode: str, precision: str, impl: str) -> dict[str, Any]:
        autocast = torch.bfloat16 if precision == "bf16" else None
        make = cq.train_step_runner if mode == "train" else cq.inference_runner
        run = make(model_for(impl), batch, autocast=autocast)
        figures = measure_step(run, device, warmup=warmup + (1 if impl == "compiled" else 0), steps=steps)
        if (mode, precision, impl) == ("train", "bf16", "fast"):
            figures["host_profile"] = host_profile(run, device, 2)
        if "loss" in figures and not math.isfinite(figures["loss"]):
            figures["failed"] = f"the loss is {figures['loss']}"
        if mode == "infer":
            # Inference has no dropout: the same weights must give the same probabilities on every impl.
            probs = tuple(t.detach().double().cpu() for t in run())
            probabilities[(precision, impl)] = probs
            ref = probabilities.get((precision, "reference"))
            if impl != "reference" and ref is not None:
                figures["max_diff_vs_reference"] = max(float((a - b).abs().max()) for a, b in zip(probs, ref))
        return figures

    # What the targets need first (bf16 training, fast vs reference), torch.compile last: it is the slowest
    # to start and the least needed. --tiny compiles one item: the code path, not the figures.
    order = [(mode, prec, impl) for prec in ("bf16", "fp32") for mode in ("train", "infer")
             for impl in ("reference", "fast")]
    compiled_items = [(mode, prec) for prec in ("bf16", "fp32") for mode in ("train", "infer")]
    order += [(mode, prec, "compiled") for mode, prec in (compiled_items[-2:-1] if ctx.tiny else compiled_items)]
    for mode, prec, impl in order:
        rec.item(f"qanet {mode} {prec} {impl}", functools.partial(item, mode, prec, impl),
                 min_s=(2.0 if ctx.tiny else 30.0) if impl == "compiled" else 0.0,
                 mode=mode, precision=prec, impl=impl)
        if device.type == "cuda":
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------
# Phase d: ConvS2S
# --------------------------------------------------------------------------------------------------

def _tokens_of(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) else result


def phase_convs2s(ctx: Ctx, rec: Recorder) -> None:
    """Phase d: the ``tutorial`` preset's train step (fast vs reference layers, fp32 and bf16 autocast) and the
    translation of 200 generated sentences, greedy and beam 5, incremental vs full-recompute decoding."""
    import torch

    from benchmarks import cases_convs2s as cc

    device = ctx.device
    if ctx.tiny:
        overrides = {"embed_dim": 8, "hidden_dim": 16, "encoder_layers": 2, "decoder_layers": 2,
                     "src_vocab_size": 41, "tgt_vocab_size": 37}
        B, S, T, sentences, lo, hi, steps, runs, warmup, beam = 2, 6, 6, 4, 3, 6, 1, 1, 1, 2
    else:
        overrides = {}
        B, S, T, sentences, lo, hi, steps, runs, warmup, beam = 64, 30, 30, 200, 12, 30, 10, 2, 2, 5
    rec.info.update(preset="tiny" if ctx.tiny else "tutorial", batch=B, src_len=S, tgt_len=T, sentences=sentences,
                    beam=beam)
    train_models = cc._models("tutorial", overrides, device, torch.float32, train=True)
    cfg = train_models["fast"].config
    src, tgt = cc.train_batch(cfg, B, S, T, device)

    def train_item(precision: str, layers: str) -> dict[str, Any]:
        autocast = torch.bfloat16 if precision == "bf16" else None
        run = cc.train_step_runner(train_models[layers], src, tgt, autocast=autocast)
        figures = measure_step(run, device, warmup=warmup, steps=steps)
        if "loss" in figures and not math.isfinite(figures["loss"]):
            figures["failed"] = f"the loss is {figures['loss']}"
        return figures

    decode_models: dict[str, Any] = {}
    sources = cc._sources(sentences, lo, hi, device, cfg.src_vocab_size)
    outputs: dict[tuple[int, str, bool], Any] = {}

    def translate_item(beam_size: int, layers: str, incremental: bool) -> dict[str, Any]:
        if not decode_models:
            decode_models.update(cc._models("tutorial", overrides, device, torch.float32, train=False))
        case = cc.TranslateCase("tutorial", sentences, beam=beam_size, min_len=lo, max_len=hi, overrides=overrides)
        run = case.decoder(decode_models[layers], sources, incremental)
        reset_peak_memory(device)
        t0 = time.perf_counter()
        result = run()                      # the first call: Triton JIT, cuBLAS handles, allocator
        _sync(device)
        first_s = time.perf_counter() - t0
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            result = run()
            _sync(device)
            times.append(time.perf_counter() - t0)
        tokens = _tokens_of(result)
        out_tokens = int(tokens.ne(-1).sum()) + tokens.shape[0]   # with each sentence's EOS
        seconds = statistics.median(times)
        figures: dict[str, Any] = {"first_call_s": round(first_s, 3), "median_s": seconds, "runs": runs,
                                   "sentences_per_s": sentences / seconds, "tokens_per_s": out_tokens / seconds,
                                   "peak_gib": peak_memory_gib(device)}
        outputs[(beam_size, layers, incremental)] = tokens.cpu()
        other = outputs.get((beam_size, layers, not incremental))
        if other is not None and other.shape == tokens.shape:
            figures["same_output_as_" + ("full" if incremental else "incremental")] = float(
                (other == tokens.cpu()).all(dim=1).double().mean())
        return figures

    rec.item("convs2s train fp32 fast", functools.partial(train_item, "fp32", "fast"), kind="train",
             precision="fp32", impl="fast")
    rec.item("convs2s train fp32 reference", functools.partial(train_item, "fp32", "reference"), kind="train",
             precision="fp32", impl="reference")
    for beam_size in (beam, 1):
        label = f"beam{beam_size}" if beam_size > 1 else "greedy"
        for incremental in (True, False):
            rec.item(f"convs2s translate {label} fast {'incremental' if incremental else 'full recompute'}",
                     functools.partial(translate_item, beam_size, "fast", incremental), kind="translate",
                     search=label, impl="fast", incremental=incremental)
    for beam_size in (beam, 1):
        label = f"beam{beam_size}" if beam_size > 1 else "greedy"
        rec.item(f"convs2s translate {label} reference incremental",
                 functools.partial(translate_item, beam_size, "reference", True), kind="translate",
                 search=label, impl="reference", incremental=True)
    rec.item("convs2s train bf16 fast", functools.partial(train_item, "bf16", "fast"), kind="train",
             precision="bf16", impl="fast")
    rec.item("convs2s train bf16 reference", functools.partial(train_item, "bf16", "reference"), kind="train",
             precision="bf16", impl="reference")


CHILD_PHASES: dict[str, Callable[[Ctx, Recorder], None]] = {"b": phase_ops, "c": phase_qanet, "d": phase_convs2s,
                                                            "f": phase_overhead}


def child_main(args: argparse.Namespace) -> int:
    """Run one in-process phase (b, c, d) into ``--result``, stopping itself at ``--deadline``."""
    rec = Recorder(Path(args.result), args.deadline)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeBoxSpent()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.05, args.deadline - time.time()))
    try:
        import torch
        ctx = Ctx(device=torch.device(args.device), tiny=args.tiny, compile_backend=args.compile_backend)
        if ctx.device.type == "cuda" and ctx.device.index is not None:
            torch.cuda.set_device(ctx.device)
        CHILD_PHASES[args.child](ctx, rec)
    except TimeBoxSpent:
        rec.info["stopped"] = "the time box ran out between items"
    except Exception as exc:  # set-up failed (imports, model building): the parent reports it with the log
        rec.info["error"] = short_error(exc)
        rec.info["error_tail"] = tail(traceback.format_exc(), 25)
        traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    rec.flush(done=True)
    return 0


# ==================================================================================================
# The parent: phases in order, time boxes, the summary
# ==================================================================================================

def time_box(budget_s: float, explicit: bool, remaining_s: float, later_budgets_s: float) -> float:
    """Seconds a phase may run: its budget, raised (unless the budget was given explicitly) to what the global
    budget has left once the later phases' budgets are set aside; never more than the global budget left."""
    if remaining_s <= 0:
        return 0.0
    box = budget_s if explicit else max(budget_s, remaining_s - later_budgets_s)
    return min(box, remaining_s)


def _own_process_group() -> dict[str, Any]:
    """Popen arguments that start the command as the leader of a new process group, so that a timeout can
    signal the command and everything it started (and nothing else) by that group's id."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def run_process(cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` in the repository, output to ``log``, in a process group of its own; on timeout the group
    (pytest-xdist workers, compile workers) gets SIGTERM, then SIGKILL. -> (exit code or None on timeout, seconds)."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, **_own_process_group())
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return rc, time.perf_counter() - t0


def _child_env(autotune: bool = False) -> dict[str, str]:
    """The phases' environment: unbuffered output, and each Triton kernel on its first configuration unless
    ``--autotune`` (tuning compiles every configuration of every kernel per shape bucket and dtype: minutes of a
    first device run; the first configurations are the ones the compile check proves, spill-free)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["FASTQA_TRITON_AUTOTUNE"] = "1" if autotune else "0"
    return env


def run_pytest_phase(args: argparse.Namespace, box: float, logs: Path) -> dict[str, Any]:
    """Phase a: the tests marked ``gpu`` in tests/ops, in parallel where pytest-xdist is installed."""
    import importlib.util
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/ops", "-q", "-x", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(min(8, max(2, (os.cpu_count() or 2) // 2)))]
    log = logs / "a-pytest.log"
    rc, seconds = run_process(cmd, log, box, _child_env(args.autotune))
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


def run_child_phase(phase: Phase, args: argparse.Namespace, box: float, logs: Path) -> dict[str, Any]:
    """Phases b, c, d: this script again in ``--child`` mode, stopping itself at the box's end; killed
    ``KILL_GRACE_S`` later if it has not."""
    result_path = logs / f"{phase.key}.json"
    result_path.unlink(missing_ok=True)
    deadline = time.time() + box
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", phase.key, "--result", str(result_path),
           "--deadline", repr(deadline), "--device", args.device, "--compile-backend", args.compile_backend]
    if args.tiny:
        cmd.append("--tiny")
    log = logs / f"{phase.key}.log"
    rc, seconds = run_process(cmd, log, box + KILL_GRACE_S, _child_env(args.autotune))
    data: dict[str, Any] = {}
    if result_path.exists():
        try:
            data = json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            data = {"info": {"error": f"unreadable result file: {exc}"}}
    items = data.get("items", [])
    info = data.get("info", {})
    result: dict[str, Any] = {"seconds": round(seconds, 1), "log": str(log), "exit_code": rc, "items": items,
                              "info": info}
    failed = [i for i in items if i.get("status") == "failed"]
    skipped = [i for i in items if i.get("status") == "skipped"]
    ok = [i for i in items if i.get("status") == "ok"]
    counts = f"{len(ok)} ok, {len(failed)} failed, {len(skipped)} skipped of {len(items)} items"
    if rc is None:
        result.update(status="failed", reason=f"killed after {box + KILL_GRACE_S:.0f} s ({counts} recorded)",
                      error_tail=read_tail(log))
    elif rc != 0 or not data.get("done"):
        result.update(status="failed", reason=f"exit code {rc} ({counts} recorded)", error_tail=read_tail(log))
    elif info.get("error"):
        result.update(status="failed", reason=f"set-up failed: {info['error']}",
                      error_tail=info.get("error_tail") or read_tail(log))
    elif failed:
        result.update(status="failed", reason=counts)
    elif not ok:
        result.update(status="skipped", reason=f"the time box ran out before any item finished ({counts})")
    else:
        result.update(status="ok", reason=counts if skipped else None)
    if phase.key == "b" and info.get("ops_without_a_check"):
        result["note"] = "ops without a check: " + ", ".join(info["ops_without_a_check"])
    return result


def bench_command(args: argparse.Namespace, out: Path) -> list[str]:
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
    rc, seconds = run_process(cmd, log, box, _child_env(args.autotune))
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


# --------------------------------------------------------------------------------------------------
# The summary
# --------------------------------------------------------------------------------------------------

def _items(phase: dict[str, Any]) -> list[dict[str, Any]]:
    return phase.get("result", {}).get("items", [])


def _ms(item: dict[str, Any]) -> float | None:
    return item.get("median_ms") if item.get("status") == "ok" else None


def targets(phases: dict[str, dict[str, Any]], tiny: bool) -> list[dict[str, str]]:
    """The GPU targets, judged from what the phases measured: met / missed / unknown, with the figures."""
    out: list[dict[str, str]] = []

    def add(name: str, verdict: bool | None, figures: str) -> None:
        out.append({"target": name, "verdict": "unknown" if verdict is None else ("met" if verdict else "missed"),
                    "figures": figures})

    c = {(i.get("mode"), i.get("precision"), i.get("impl")): i for i in _items(phases.get("c", {}))}
    fast, ref = c.get(("train", "bf16", "fast"), {}), c.get(("train", "bf16", "reference"), {})
    if _ms(fast) and _ms(ref):
        ratio = _ms(ref) / _ms(fast)
        add("QANet paper B32 bf16 train step: fast layers >= 1.5x reference layers", ratio >= 1.5,
            f"{_ms(fast):.1f} vs {_ms(ref):.1f} ms/step: {ratio:.2f}x")
    else:
        add("QANet paper B32 bf16 train step: fast layers >= 1.5x reference layers", None, "not measured")
    syncs = (fast.get("host_syncs") or {}) if fast else {}
    if "count" in syncs:
        add("QANet fast bf16 train step: no host sync inside a step", syncs["count"] == 0,
            f"{syncs['count']} per step" + (f" ({'; '.join(syncs['sites'][:3])})" if syncs.get("sites") else ""))
    else:
        add("QANet fast bf16 train step: no host sync inside a step", None, "CUDA only" if fast else "not measured")
    d = {(i.get("search"), i.get("impl"), i.get("incremental")): i for i in _items(phases.get("d", {}))}
    beams = sorted({k[0] for k in d if k[0] and k[0].startswith("beam")})
    label = beams[0] if beams else "beam5"
    inc, full = d.get((label, "fast", True), {}), d.get((label, "fast", False), {})
    if inc.get("status") == "ok" and full.get("status") == "ok":
        ratio = full["median_s"] / inc["median_s"]
        add(f"ConvS2S {label} translation: incremental >= 5x full recompute", ratio >= 5.0,
            f"{inc['sentences_per_s']:.1f} vs {full['sentences_per_s']:.1f} sentences/s: {ratio:.2f}x")
    else:
        add(f"ConvS2S {label} translation: incremental >= 5x full recompute", None, "not measured")
    rows = [r for r in phases.get("e", {}).get("result", {}).get("rows", []) if r.get("vs_eager")]
    if rows:
        slow = [f"{r['op']}/{r['case']} {r['mode']} {r['vs_eager']:.2f}x" for r in rows if r["vs_eager"] < 1.5]
        add("every fastqa op >= 1.5x eager (bench --quick cases)", not slow,
            f"{len(rows) - len(slow)}/{len(rows)} cases" + (f"; below: {', '.join(slow[:6])}" if slow else ""))
        comp = [r for r in rows if r.get("vs_compiled")]
        if comp:
            slow_c = [f"{r['op']}/{r['case']} {r['mode']} {r['vs_compiled']:.2f}x" for r in comp if r["vs_compiled"] < 1.0]
            add("every fastqa op >= 1.0x torch.compile (bench --quick, compiled cases)", not slow_c,
                f"{len(comp) - len(slow_c)}/{len(comp)} cases" + (f"; below: {', '.join(slow_c[:6])}" if slow_c else ""))
    else:
        add("every fastqa op >= 1.5x eager (bench --quick cases)", None, "not measured")
    if tiny:
        for t in out:
            t["figures"] += " [tiny shapes: not a measurement]"
    return out


def _status(item: dict[str, Any]) -> str:
    """An item's status and, where it has one, the reason."""
    return item["status"] + (f": {item['reason']}" if item.get("reason") else "")


def _phase_detail_lines(key: str, result: dict[str, Any]) -> list[str]:
    """The per-phase section of summary.txt."""
    lines: list[str] = []
    if key == "a":
        lines.append(f"$ {result.get('command', '')}")
        if result.get("counts"):
            lines.append("counts: " + ", ".join(f"{v} {k}" for k, v in result["counts"].items()))
        lines.append(f"log: {result.get('log')}; its tail:")
        lines += ["  " + s for s in result.get("output_tail", "").splitlines()[-15:]]
    elif key == "b":
        lines.append("rel = max|got - ref| / max(max|ref|, max|ref output|) per tensor, ref = fastqa.reference in "
                     f"float64 on the same device and rounded inputs; tolerance fp32 {TOLERANCES['float32']:.0e}, bf16 {TOLERANCES['bfloat16']:.0e}, "
                     f"or {EAGER_FACTOR:g}x eager rel (the reference op run in the same dtype)")
        lines.append(f"{'op':<24}{'case':<30}{'dtype':<6}{'backend':<10}{'kernels':>8}  {'worst tensor':<18}"
                     f"{'max abs':>10}{'rel':>10}{'eager rel':>10}  result")
        for i in result.get("items", []):
            t = (i.get("tensors") or {}).get(i.get("worst"), {})
            kernels = (i.get("launches") or {}).get("kernels")
            fallback = " (fallback warned)" if i.get("fallback_warnings") else ""
            lines.append(f"{i.get('op', ''):<24}{i.get('case', '')[:29]:<30}{DTYPE_SHORT.get(i.get('dtype'), '?'):<6}"
                         f"{i.get('backend', '-'):<10}{fmt_num(kernels, 'd') if kernels is not None else '-':>8}  "
                         f"{i.get('worst', '-'):<18}{fmt_num(t.get('max_abs'), '.2e'):>10}{fmt_num(t.get('rel'), '.2e'):>10}"
                         f"{fmt_num(t.get('eager_rel'), '.2e'):>10}  "
                         f"{i['status']}{fallback}" + (f": {i['reason']}" if i.get("reason") else ""))
    elif key == "c":
        info = result.get("info", {})
        lines.append(f"QANet {info.get('preset')} B{info.get('batch')} context {info.get('context')} question "
                     f"{info.get('question')}; ms/step: the median of {info.get('steps')} timed steps; torch.compile backend "
                     f"{info.get('compile_backend')}")
        lines.append("x ref: the reference layers' ms/step over this one's; dp: max |p - p_reference| of the start/end "
                     "probabilities (inference, same weights)")
        lines.append(f"{'mode':<7}{'prec':<6}{'impl':<11}{'ms/step':>9}{'x ref':>7}{'syncs':>7}{'kernels':>9}"
                     f"{'memcpy':>8}{'peak GiB':>9}{'first s':>9}{'loss':>9}{'dp':>10}  result")
        ref = {(i.get("mode"), i.get("precision")): _ms(i) for i in result.get("items", []) if i.get("impl") == "reference"}
        for i in result.get("items", []):
            ms, base = _ms(i), ref.get((i.get("mode"), i.get("precision")))
            launches = i.get("launches") or {}
            syncs = (i.get("host_syncs") or {}).get("count")
            lines.append(f"{i.get('mode', ''):<7}{i.get('precision', ''):<6}{i.get('impl', ''):<11}{fmt_num(ms):>9}"
                         f"{fmt_num(base / ms if ms and base else None):>7}{fmt_num(syncs, 'd') if syncs is not None else '-':>7}"
                         f"{fmt_num(launches.get('kernels'), 'd') if launches else '-':>9}"
                         f"{fmt_num(launches.get('memcpy'), 'd') if launches else '-':>8}{fmt_num(i.get('peak_gib')):>9}"
                         f"{fmt_num(i.get('first_call_s'), '.1f'):>9}{fmt_num(i.get('loss'), '.4f'):>9}"
                         f"{fmt_num(i.get('max_diff_vs_reference'), '.1e'):>10}  {i['status']}"
                         + (f": {i['reason']}" if i.get("reason") else ""))
            if (i.get("host_syncs") or {}).get("sites"):
                lines.append(f"{'':<24}sync sites: {'; '.join(i['host_syncs']['sites'])}")
        for i in result.get("items", []):
            if i.get("host_ms") is not None and i.get("status") == "ok":
                lines.append(f"host ms to issue a step, {i['mode']} {i['precision']} {i['impl']}: "
                             f"{i['host_ms']:.2f} of {i['median_ms']:.2f}")
        profiled = next((i for i in result.get("items", []) if i.get("host_profile")), None)
        if profiled is not None:
            lines.append(f"host profile, {profiled['mode']} {profiled['precision']} {profiled['impl']}:")
            lines += ["  " + line[:160] for line in profiled["host_profile"][:20]]
    elif key == "d":
        info = result.get("info", {})
        lines.append(f"ConvS2S {info.get('preset')}: train step B{info.get('batch')} source {info.get('src_len')} "
                     f"target {info.get('tgt_len')}; translation of {info.get('sentences')} sentences")
        for i in result.get("items", []):
            head = f"{i['name']:<52}"
            if i.get("status") != "ok":
                lines.append(head + _status(i))
            elif i.get("kind") == "train":
                syncs = (i.get("host_syncs") or {}).get("count")
                kernels = (i.get("launches") or {}).get("kernels")
                lines.append(f"{head}{i['median_ms']:9.2f} ms/step  syncs {fmt_num(syncs, 'd') if syncs is not None else '-'}"
                             f"  kernels {fmt_num(kernels, 'd') if kernels is not None else '-'}  loss {fmt_num(i.get('loss'), '.4f')}")
            else:
                same = next((f"  same tokens as {k[len('same_output_as_'):]}: {v:.0%}" for k, v in i.items()
                             if k.startswith("same_output_as_")), "")
                lines.append(f"{head}{i['median_s']:9.3f} s  {i['sentences_per_s']:8.1f} sentences/s  "
                             f"{i['tokens_per_s']:9.0f} tokens/s{same}")
    elif key == "f":
        lines.append("ms per call waited for (host: the host's ms to issue it; graph: per CUDA-graph replay, the "
                     "kernels alone); bf16")
        lines.append(f"{'case':<44}{'fastqa fwd':>11}{'host':>7}{'graph':>7}{'eager fwd':>10}{'host':>7}{'graph':>7}"
                     f"{'fastqa f+b':>11}{'host':>7}{'eager f+b':>10}{'host':>7}")
        for i in result.get("items", []):
            head = f"{(i.get('op', '') + '/' + i.get('case', ''))[:43]:<44}"
            if i.get("status") != "ok":
                lines.append(head + _status(i))
                continue
            lines.append(head + "".join(f"{fmt_num(i.get(k), '.3f'):>{w}}" for k, w in (
                ("fastqa_fwd_ms", 11), ("fastqa_fwd_host_ms", 7), ("fastqa_fwd_graph_ms", 7), ("eager_fwd_ms", 10),
                ("eager_fwd_host_ms", 7), ("eager_fwd_graph_ms", 7), ("fastqa_fwdbwd_ms", 11),
                ("fastqa_fwdbwd_host_ms", 7), ("eager_fwdbwd_ms", 10), ("eager_fwdbwd_host_ms", 7))))
            for k in ("fastqa_fwd_graph_error", "eager_fwd_graph_error"):
                if i.get(k):
                    lines.append(f"{'':<44}{k}: {i[k][:150]}")
        profiled = next((i for i in result.get("items", []) if i.get("host_profile")), None)
        if profiled is not None:
            lines.append(f"host profile, {profiled['op']} fastqa forward+backward:")
            lines += ["  " + line[:160] for line in profiled["host_profile"][:14]]
    elif key == "e":
        lines.append(f"$ {result.get('command', '')}")
        rows = result.get("rows", [])
        if rows:
            lines.append(f"{'case':<52}{'mode':<9}{'fastqa ms':>10}{'x eager':>9}{'x compiled':>11}{'of bound':>9}")
            for r in rows:
                lines.append(f"{(r['op'] + '/' + r['case'])[:51]:<52}{r['mode']:<9}{fmt_num(r['fastqa_ms'], '.3f'):>10}"
                             f"{fmt_num(r['vs_eager']):>9}{fmt_num(r['vs_compiled']):>11}"
                             f"{fmt_num(r['of_bound'] * 100 if r.get('of_bound') else None, '.0f'):>8}%")
        for s in result.get("skipped_impls", [])[:12]:
            lines.append(f"  not timed: {s}")
    first_error = next((i for i in result.get("items", []) if i.get("error_tail")), None)
    if first_error is not None:
        lines.append(f"first error ({first_error['name']}):")
        lines += ["  " + s for s in first_error["error_tail"].splitlines()[-12:]]
    if result.get("note"):
        lines.append(f"note: {result['note']}")
    if result.get("error_tail"):
        lines.append("error tail:")
        lines += ["  " + s for s in result["error_tail"].splitlines()[-20:]]
    return lines


def render_summary(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    lines = [f"fastqa gpu-check  {meta['started']}  ({'tiny mode, ' if meta['tiny'] else ''}device {meta['device']}, "
             f"global budget {meta['budget_s']:.0f} s, ran {meta['elapsed_s']:.0f} s)"]
    lines += environment_lines(summary["environment"])
    lines.append("")
    for p in summary["phases"]:
        reason = f"  {p['reason']}" if p.get("reason") else ""
        lines.append(f"phase {p['key']}  {p['title']:<62} {p['status']:<8}{fmt_s(p.get('seconds')):>9}{reason}")
    lines.append("")
    lines.append("targets:")
    for t in summary.get("targets", []):
        lines.append(f"  {t['verdict']:<8}{t['target']}: {t['figures']}")
    for p in summary["phases"]:
        if not p.get("result"):
            continue
        lines.append("")
        lines.append(f"== phase {p['key']}: {p['title']} ({p['status']}) ==")
        lines += _phase_detail_lines(p["key"], p["result"])
    return "\n".join(lines) + "\n"


def parse_phase_budgets(values: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v in values:
        key, sep, seconds = v.partition("=")
        if not sep or key not in PHASE_KEYS:
            raise argparse.ArgumentTypeError(f"--phase-budget takes PHASE=SECONDS with PHASE in {','.join(PHASE_KEYS)}, got {v!r}")
        out[key] = float(seconds)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu-check-results"), help="where the summary, logs and bench go")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and step counts: every phase in seconds, on a CPU too")
    p.add_argument("--phases", default=",".join(PHASE_KEYS), help="comma list of the phases to run (default: all)")
    p.add_argument("--budget-s", type=float, default=GLOBAL_BUDGET_S, help="global time budget of the phases, seconds")
    p.add_argument("--phase-budget", action="append", default=[], metavar="PHASE=SECONDS",
                   help="this phase's time box, exactly (no slack from the global budget); repeatable")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--autotune", action="store_true",
                   help="let the Triton autotuner tune every kernel (default: each kernel's first configuration)")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of phase c (default: inductor; eager with --tiny, as inductor's C++ "
                        "compiles take minutes on a small CPU)")
    # Child mode: one in-process phase, run by the parent.
    p.add_argument("--child", choices=sorted(CHILD_PHASES), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.selected = [k for k in args.phases.split(",") if k]
    unknown = [k for k in args.selected if k not in PHASE_KEYS]
    if unknown:
        p.error(f"unknown phase(s) {', '.join(unknown)}; phases are {', '.join(PHASE_KEYS)}")
    try:
        args.budgets = parse_phase_budgets(args.phase_budget)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.compile_backend is None:
        args.compile_backend = "eager" if args.tiny else "inductor"
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    start = time.monotonic()
    out: Path = args.out.resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in ("summary.txt", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    print(f"fastqa gpu-check: device {args.device}{' (tiny)' if args.tiny else ''}, budget {args.budget_s:.0f} s, "
          f"phases {','.join(args.selected)}, out {out}", flush=True)
    summary: dict[str, Any] = {
        "meta": {"started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                 "tiny": args.tiny, "device": args.device, "budget_s": args.budget_s, "elapsed_s": 0.0,
                 "autotune": args.autotune,
                 "argv": list(argv) if argv is not None else sys.argv[1:], "tolerances": TOLERANCES},
        "environment": collect_environment(args.device), "phases": [], "targets": []}
    for line in environment_lines(summary["environment"]):
        print(line, flush=True)

    def save() -> None:
        summary["meta"]["elapsed_s"] = round(time.monotonic() - start, 1)
        by_key = {p["key"]: p for p in summary["phases"]}
        summary["targets"] = targets(by_key, args.tiny)
        write_json_atomic(out / "summary.json", summary)
        (out / "summary.txt").write_text(render_summary(summary))

    for index, phase in enumerate(PHASES):
        budget = args.budgets.get(phase.key, phase.tiny_budget_s if args.tiny else phase.budget_s)
        least = phase.tiny_min_s if args.tiny else phase.min_s
        record: dict[str, Any] = {"key": phase.key, "title": phase.title, "budget_s": budget}
        summary["phases"].append(record)
        elapsed = time.monotonic() - start
        remaining = args.budget_s - elapsed
        later = sum(args.budgets.get(p.key, p.tiny_budget_s if args.tiny else p.budget_s)
                    for p in PHASES[index + 1:] if p.key in args.selected)
        box = time_box(budget, phase.key in args.budgets, remaining, later)
        record["time_box_s"] = round(box, 1)
        if phase.key not in args.selected:
            record.update(status="skipped", reason=f"not selected (--phases {args.phases})")
        elif remaining <= 0:
            record.update(status="skipped", reason=f"global budget of {args.budget_s:.0f} s spent ({elapsed:.0f} s elapsed)")
        elif box < least:
            record.update(status="skipped", reason=f"only {box:.1f} s of budget for it (phase budget {budget:.0f} s, "
                                                   f"{remaining:.0f} s of the global budget left); it needs at least {least:.0f} s")
        else:
            print(f"\n== phase {phase.key}: {phase.title} (time box {box:.0f} s) ==", flush=True)
            try:
                if phase.key == "a":
                    result = run_pytest_phase(args, box, logs)
                elif phase.key == "e":
                    result = run_bench_phase(args, box, logs, out)
                else:
                    result = run_child_phase(phase, args, box, logs)
            except Exception as exc:  # the check itself broke: recorded, and the next phase still runs
                result = {"status": "failed", "reason": f"gpu_check error: {short_error(exc)}",
                          "error_tail": tail(traceback.format_exc(), 25)}
            record.update(status=result.pop("status"), reason=result.pop("reason", None),
                          seconds=result.get("seconds"), result=result)
        print(f"phase {phase.key}: {record['status']}" + (f" ({record['reason']})" if record.get("reason") else ""),
              flush=True)
        save()
    save()
    text = (out / "summary.txt").read_text()
    print("\n" + text, flush=True)
    # The phases and targets once more, last: where only the end of the output is kept, this is what survives.
    recap = [line for line in text.splitlines() if line.startswith("phase ") or line.startswith("  ")
             and line.split()[:1] in (["met"], ["missed"], ["unknown"])]
    print("recap:\n" + "\n".join(recap), flush=True)
    print(f"wrote {out / 'summary.txt'} and {out / 'summary.json'}", flush=True)
    # Exit 0 whatever the phases found: what failed is in the summary, and a command chained after this one
    # (packing the logs) must still run.
    return 0


if __name__ == "__main__":
    sys.exit(main())
