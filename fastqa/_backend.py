"""Backend selection shared by every op.

Backends:
  * ``reference`` -- pure PyTorch (``fastqa.reference``), always there: the ground truth and fallback.
  * ``cpu``       -- the C++ extension ``fastqa._C`` (``torch.ops.fastqa.*``), float32/float64 CPU tensors.
  * ``triton``    -- the GPU path: CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``. The ops with a
                     Triton kernel run it (``fastqa.triton_kernels``); linear, self_attention and
                     decode_attention have none and run torch's own ops there (``F.linear``, torch's fused
                     attention: see each ``fastqa/ops/<op>.py``).

``backend="auto"`` (the default) picks the fastest usable one for the tensors' device and dtype;
``backend=`` or the ``FASTQA_BACKEND`` environment variable forces one, and forcing one that cannot
run raises. An automatic fallback to the reference warns once per (op, reason) on the CPU, and once per op
for CUDA tensors (``warn_cuda_reference``: on a GPU the reference is the slow path a user must hear about,
whatever the reason).

The engine decisions that change rounding -- the CPU GEMM engine per shape, the Triton autotuner's
configuration per (kernel, key) -- are exported by ``kernel_choices()`` and reinstated by
``restore_kernel_choices()``, so a resumed training run repeats the uninterrupted run's losses bit for bit.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from typing import Any

import torch

from ._version import __version__

BACKENDS = ("reference", "cpu", "triton")
_CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _load_extension() -> tuple[Any, str | None]:
    try:
        from fastqa import _C  # noqa: F401  (importing registers torch.ops.fastqa.*)
    except ImportError as exc:
        return None, f"fastqa._C is not built ({exc}); reinstall without FASTQA_NO_EXT=1"
    return _C, None


_EXT, _EXT_ERROR = _load_extension()
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
_WARNED: set[tuple[str, str]] = set()
# The module of the Triton kernels (the package ships them as fastqa.triton_kernels).
_TRITON_PACKAGE = "fastqa.triton_kernels"


def cpu_available() -> bool:
    """True when the C++ extension is built and loaded."""
    return _EXT is not None


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available(device: torch.device) -> bool:
    """True when Triton kernels can run on tensors of ``device``."""
    if not _TRITON_INSTALLED:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and triton_interpreting()


def triton_usable_here() -> bool:
    """True when Triton kernels can run on some device of this process (CUDA, or the interpreter)."""
    return _TRITON_INSTALLED and (torch.cuda.is_available() or triton_interpreting())


def _unusable_reason(backend: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``backend`` cannot run on (device, dtype), or None when it can."""
    if backend == "reference":
        return None
    if backend == "cpu":
        if _EXT is None:
            return _EXT_ERROR
        if device.type != "cpu":
            return f"the cpu backend takes CPU tensors, got {device.type} tensors"
        if dtype not in _CPU_DTYPES:
            return f"the cpu backend takes float32, float64 or bfloat16, got {dtype}"
        return None
    if backend == "triton":
        if not _TRITON_INSTALLED:
            return "triton is not installed (pip install triton)"
        if device.type == "cpu" and not triton_interpreting():
            return "the triton backend runs CPU tensors only under TRITON_INTERPRET=1"
        if device.type not in ("cpu", "cuda"):
            return f"the triton backend takes CUDA tensors, got {device.type} tensors"
        if dtype not in _TRITON_DTYPES:
            return f"the triton backend takes float32, float16 or bfloat16, got {dtype}"
        return None
    raise ValueError(f"backend must be one of 'auto', {', '.join(map(repr, BACKENDS))}; got {backend!r}")


def resolve_backend(backend: str | None, op: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend that runs ``op`` on tensors of (device, dtype).

    ``backend`` None or "auto" consults ``FASTQA_BACKEND`` and then picks automatically.
    """
    if backend is None or backend == "auto":
        backend = os.environ.get("FASTQA_BACKEND", "auto") or "auto"
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend != "auto":
        reason = _unusable_reason(backend, device, dtype)
        if reason is not None:
            raise RuntimeError(f"fastqa.{op}: backend={backend!r} cannot run here: {reason}")
        return backend
    preferred = "triton" if device.type == "cuda" else "cpu"
    reason = _unusable_reason(preferred, device, dtype)
    if reason is None:
        return preferred
    if device.type == "cuda":
        warn_cuda_reference(op, device, f"{preferred} unusable: {reason}", stacklevel=4)
    else:
        _warn_fallback(op, preferred, reason)
    return "reference"


def _warn_fallback(op: str, preferred: str, reason: str) -> None:
    if torch.compiler.is_compiling() or (op, reason) in _WARNED:
        return
    _WARNED.add((op, reason))
    warnings.warn(f"fastqa.{op}: falling back to the reference backend ({preferred} unusable: {reason})",
                  RuntimeWarning, stacklevel=4)


def warn_cuda_reference(op: str, device: torch.device, reason: str, *, stacklevel: int = 3) -> None:
    """Warn, once per op, that ``op`` runs its pure-PyTorch reference on CUDA tensors although the caller
    did not ask for it (``reason`` says why). A no-op for tensors on other devices."""
    if device.type != "cuda" or torch.compiler.is_compiling() or (op, "cuda") in _WARNED:
        return
    _WARNED.add((op, "cuda"))
    warnings.warn(f"fastqa.{op}: falling back to the reference backend on a CUDA tensor ({reason}); later "
                  f"fallbacks of this op stay quiet", RuntimeWarning, stacklevel=stacklevel)


def cpu_gemm_plan() -> dict[str, Any] | None:
    """What the CPU GEMM engine decided in this process (the process engine and every shape's) and which route
    each bf16 op took per shape class (``routes``: native bf16 or widened to float32), for a training
    checkpoint: ``restore_cpu_gemm_plan`` in a resumed process makes it multiply every shape on
    the same engine, so its losses equal the uninterrupted run's bit for bit. None without the extension
    or with a bad ``FASTQA_CPU_GEMM``."""
    info = cpu_gemm_info()
    if info is None or "error" in info:
        return None
    return {"engine": info["engine"], "shapes": [{k: s[k] for k in ("m", "k", "n", "threads", "a", "w", "bias",
                                                                    "accumulate", "engine")}
                                                 for s in info["shapes"]],
            "routes": [{k: r[k] for k in ("op", "shape", "threads", "route")} for r in info.get("routes", [])]}


def restore_cpu_gemm_plan(plan: dict[str, Any] | None) -> None:
    """Take another process's ``cpu_gemm_plan()`` (no-op for None or without the extension; the engines are
    not taken where ``FASTQA_CPU_GEMM`` forces one or oneDNN is not usable, the bf16 routes always are, though
    ``FASTQA_CPU_BF16_ROUTE=native|widen`` overrides them)."""
    if plan is None or _EXT is None or "error" in (cpu_gemm_info() or {}):
        return
    _EXT.gemm_restore(plan["engine"], plan["shapes"])
    if plan.get("routes"):  # the bf16 routes (plans saved before they existed have none)
        _EXT.route_restore(plan["routes"])


# Keys of ``kernel_choices()``.
_CPU_GEMM_KEY, _TRITON_KEY = "cpu_gemm", "triton"
# Triton choices restored where Triton cannot run (a GPU run resumed on a CPU): handed on unchanged by
# ``kernel_choices()``, so a checkpoint written here still carries them to a later GPU resume.
_UNAPPLIED_TRITON: dict[str, dict[str, dict[str, Any]]] = {}


def kernel_choices() -> dict[str, Any]:
    """Every engine decision of this process that changes rounding, for a training checkpoint:
    ``{"cpu_gemm": cpu_gemm_plan(), "triton": <kernel name -> {autotuning key: configuration}>}`` (Triton
    empty where no kernel has been tuned or Triton is missing). ``restore_kernel_choices`` takes it back."""
    triton_choices: dict[str, dict[str, dict[str, Any]]] = {k: dict(v) for k, v in _UNAPPLIED_TRITON.items()}
    common = sys.modules.get(f"{_TRITON_PACKAGE}._common")   # nothing tuned before the kernels were imported
    if common is not None:
        for name, choices in common.autotune_choices().items():
            triton_choices.setdefault(name, {}).update(choices)
    return {_CPU_GEMM_KEY: cpu_gemm_plan(), _TRITON_KEY: triton_choices}


def restore_kernel_choices(state: dict[str, Any] | None) -> None:
    """Reinstate another process's ``kernel_choices()``: the CPU GEMM plan and each Triton kernel's tuned
    configuration per key (kernels and configurations this version no longer has are skipped: they tune
    afresh). Also takes what checkpoints stored before Triton choices were saved: a bare
    ``cpu_gemm_plan()`` dict, or None."""
    if state is None:
        return
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from kernel_choices(), got {type(state).__name__}")
    if _CPU_GEMM_KEY not in state and _TRITON_KEY not in state:   # an older checkpoint: the plan alone
        restore_cpu_gemm_plan(state)
        return
    restore_cpu_gemm_plan(state.get(_CPU_GEMM_KEY))
    triton_choices = state.get(_TRITON_KEY) or {}
    if not triton_choices:
        return
    if not triton_usable_here():
        _UNAPPLIED_TRITON.update({k: dict(v) for k, v in triton_choices.items()})
        return
    common = importlib.import_module(f"{_TRITON_PACKAGE}._common")
    common.restore_autotune_choices(triton_choices)


def cpu_gemm_info() -> dict[str, Any] | None:
    """The CPU kernels' GEMM engine (``FASTQA_CPU_GEMM``): ``engine`` in use for float32 ("blas":
    MKL/OpenBLAS through at::mm, "onednn": torch's oneDNN), ``requested``, ``onednn_available`` and
    ``gflops``, each engine's measured float32 rate on one 512³ product, ``tile_gflops`` on the kernels' tile products
    (every thread multiplying its own 128 x 128 tile; what chooses ``engine``), ``shapes`` (each GEMM shape's engine), ``routes`` (each bf16
    op's route per shape class, with the milliseconds each route measured), ``bf16_route``
    (``FASTQA_CPU_BF16_ROUTE``) and ``bf16_brgemm`` (whether the native bf16 routes multiply on PyTorch's
    batch-reduce GEMM micro-kernel here: checked once on known values). The first call measures (a fraction of a second) unless an op already did;
    None without the extension; ``{"error": ...}`` for a bad variable."""
    if _EXT is None:
        return None
    try:
        return dict(_EXT.gemm_info())
    except RuntimeError as exc:  # e.g. FASTQA_CPU_GEMM=onednn where torch has no oneDNN
        return {"error": str(exc).splitlines()[0]}


def cpu_glu_conv() -> str:
    """How the CPU ``glu_conv1d`` runs its K taps (``FASTQA_CPU_GLU_CONV``): "auto" (Winograd F(9-K, K) for
    2 <= K <= 7, the taps otherwise), "winograd" (the same) or "taps"; the kernel reads it at every call. bfloat16
    inputs always take the taps."""
    return os.environ.get("FASTQA_CPU_GLU_CONV") or "auto"


def info() -> dict[str, Any]:
    """What is built and usable here: versions, backends, threads, the CPU GEMM engine."""
    triton_version = None
    if _TRITON_INSTALLED:
        try:
            triton_version = importlib.import_module("triton").__version__
        except Exception as exc:  # a broken triton install should not break fastqa.info()
            triton_version = f"unimportable: {exc}"
    return {
        "fastqa": __version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "backends": {
            "reference": True,
            "cpu": cpu_available(),
            "triton": triton_usable_here(),
        },
        "cpu_extension": None if _EXT is None else {"simd": _EXT.simd, "threads": torch.get_num_threads(),
                                                    "gemm": cpu_gemm_info(),
                                                    "glu_conv": cpu_glu_conv()},
        "cpu_extension_error": _EXT_ERROR,
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "triton_interpret": triton_interpreting(),
        "cpu_bf16": cpu_bf16_support(),
    }


# /proc/cpuinfo flags naming bf16 arithmetic units, the faster first: AMX's bf16 tiles, AVX512's bf16 dot products.
BF16_UNIT_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bf16_units(cpuinfo: str | None = None) -> list[str] | None:
    """The CPU's bf16 arithmetic units by their /proc/cpuinfo flags (all of them, in ``BF16_UNIT_FLAGS``' order:
    an AMX Xeon has both), [] for none, None where the flags cannot be read (no /proc/cpuinfo).
    ``cpuinfo``: the file's text (read when None)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith(("flags", "Features"))), None)
    return None if flags is None else [unit for unit in BF16_UNIT_FLAGS if unit in flags]


def cpu_bf16_support(cpuinfo: str | None = None) -> str | None:
    """The CPU's native bfloat16 arithmetic: "amx_bf16" (matrix tiles: Intel Xeon 4th generation and later),
    "avx512_bf16" (vector dot products: AMD Zen 4 and later, Intel Cooper Lake), "none", or None where the CPU's
    flags cannot be read (no /proc/cpuinfo). ``cpuinfo``: the text of /proc/cpuinfo (read when None)."""
    units = cpu_bf16_units(cpuinfo)
    return None if units is None else (units[0] if units else "none")


def cpu_bf16_refusal(what: str) -> str | None:
    """Why bfloat16 must not be used for ``what`` ("--precision bf16") on this CPU, or None where the processor
    multiplies bf16 natively (``cpu_bf16_support``: AMX or AVX512-BF16). Elsewhere torch emulates bf16 products
    in float32 arithmetic, slower than float32 itself, so a bf16 run would only lose accuracy."""
    support = cpu_bf16_support()
    if support in ("amx_bf16", "avx512_bf16"):
        return None
    found = "its flags cannot be read" if support is None else "it has neither"
    return (f"{what} on the CPU needs a processor that multiplies bfloat16 natively (amx_bf16 or avx512_bf16 in "
            f"/proc/cpuinfo): {found}; use fp32")
