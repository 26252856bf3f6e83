"""What every Triton launcher of fastqa shares: the interpreter flag, autotuning spaces and the autotune
switch, the one launch path (device guard, tuned or default configuration), the export and restore of the
autotuner's choices, accumulator / dot dtypes, the fp32 dot precision policy, the SM count, custom-op
registration and the tile offsets every kernel starts from (``tile_range``).

Precision policy (the same for every op; the README's backend table states it): accumulation is fp32
(fp64 for fp64 inputs, which only the interpreter runs, for gradcheck). ``tl.dot`` on fp32 operands
follows torch's float32 matmul precision, as ``torch.matmul`` does:

  * ``torch.get_float32_matmul_precision() == "highest"`` (torch's default): ``"tf32x3"`` -- three
    TF32 tensor-core passes, error at the level of fp32 rounding (IEEE FMA dots would run on CUDA
    cores, several times slower);
  * ``"high"`` / ``"medium"`` (``torch.backends.cuda.matmul.allow_tf32 = True``): plain ``"tf32"``
    (10-bit mantissa operands, ~1e-3 relative error);
  * ROCm: ``"ieee"``.

fp16 / bf16 operands go to tensor cores as they are (the precision argument is moot for them).

Parameters in fp32 (``ACCEPTS_FP32_WEIGHTS``): a kernel module that sets ``ACCEPTS_FP32_WEIGHTS = True``
accepts, for every op it registers, its parameters (weights, biases, LayerNorm weight and bias: the
module's docstring lists them) either in the activations' dtype or in float32, each on its own, with
fp16 / bf16 (or fp32, fp64) activations. The kernels round an fp32 parameter to the activations' dtype
in registers (``round_to``: round to nearest even, as ``Tensor.to`` does), so the results are bit for
bit those of the same call with the parameters cast first; a caller need not cast them per call (under
autocast the fp32 master weights go in as they are). Parameter gradients come back in each parameter's
own dtype, summed from fp32 partials with no rounding in between (fp32 for fp32 parameters).
Activations (inputs, residuals, incoming gradients) still share one dtype. ``check_param`` is the
launchers' check of that contract.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import os
import sys
from typing import Any, Callable, Optional, Sequence

import torch
import triton
import triton.language as tl

from fastqa._checks import check_tensor

#: True under TRITON_INTERPRET=1 (kernels run in Python on CPU tensors). Read once: triton.jit reads
#: it when the kernels are decorated, so it cannot change afterwards.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
              torch.float64: tl.float64}


def configs(names: Sequence[str], gpu: Sequence[tuple], interpret: Optional[dict] = None) -> list:
    """An autotuning space. ``gpu`` rows are (*block sizes in ``names`` order, num_warps, num_stages);
    the first row is the default configuration (see ``launch``). The interpreter would run every
    configuration, so it gets one small one: ``interpret`` (default: every block 16)."""
    if INTERPRET:
        return [triton.Config(dict(interpret or {n: 16 for n in names}), num_warps=4, num_stages=1)]
    return [triton.Config(dict(zip(names, row[:-2])), num_warps=row[-2], num_stages=row[-1]) for row in gpu]


def autotuning() -> bool:
    """False when ``FASTQA_TRITON_AUTOTUNE=0``: every kernel then runs its first configuration."""
    return os.environ.get("FASTQA_TRITON_AUTOTUNE", "1") != "0"


def _device_guard(args: Sequence[Any]) -> contextlib.AbstractContextManager:
    """``torch.cuda.device`` of the first CUDA tensor among ``args`` (a no-op context otherwise: CPU tensors
    under the interpreter). Triton launches on the current device and stream: without the guard, tensors
    on cuda:1 would be launched on cuda:0's stream and context."""
    for a in args:
        if isinstance(a, torch.Tensor):
            # Entering the guard costs host time on every launch: only where it changes the device.
            if a.device.type == "cuda" and a.device.index != torch.cuda.current_device():
                return torch.cuda.device(a.device)
            break
    return contextlib.nullcontext()


def launch(kernel: Any, grid, *args, **kwargs) -> None:
    """Launch a kernel on the device of its first tensor argument: every Triton launch of fastqa goes
    through here. An autotuned kernel runs its tuned configuration for the key (cached per (kernel, key),
    exported by ``autotune_choices``), or, with ``FASTQA_TRITON_AUTOTUNE=0``, its default (first) one; a
    plain ``triton.jit`` kernel (no ``configs``) runs with the launch options in ``kwargs``.

    Skipping the tuning saves compiling every configuration for every new shape bucket and dtype; the
    results are the same up to rounding (weight-gradient partials are laid out independently of the
    block sizes, so determinism holds either way).
    """
    with _device_guard(args):
        if not hasattr(kernel, "configs") or autotuning():
            kernel[grid](*args, **kwargs)
        else:
            kernel.fn[grid](*args, **kwargs, **kernel.configs[0].all_kwargs())


def _autotuners() -> dict[str, triton.runtime.Autotuner]:
    """Every autotuned kernel of the kernel modules imported so far, by "<module>.<attribute>" (e.g.
    "glu_conv1d._glu_conv1d_fwd"): the names the choices are exported under."""
    package = __name__.rpartition(".")[0]
    found: dict[str, triton.runtime.Autotuner] = {}
    seen: set[int] = set()
    for module_name, module in sorted(sys.modules.items()):
        if module is None or not module_name.startswith(package + "."):
            continue
        for attr, value in vars(module).items():
            if isinstance(value, triton.runtime.Autotuner) and id(value) not in seen:
                seen.add(id(value))
                found[f"{module_name[len(package) + 1:]}.{attr}"] = value
    return found


def autotune_choices() -> dict[str, dict[str, dict[str, Any]]]:
    """The configuration each autotuned kernel chose per key in this process: kernel name -> {repr of the
    autotuning key tuple: ``Config.all_kwargs()`` (block sizes, num_warps, num_stages, ...)}. JSON-able;
    ``restore_autotune_choices`` seeds another process's autotuners with it."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, tuner in _autotuners().items():
        choices = {repr(tuple(key)): dict(config.all_kwargs()) for key, config in tuner.cache.items()}
        if choices:
            out[name] = choices
    return out


def restore_autotune_choices(choices: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Seed each autotuner's cache with ``autotune_choices()`` of another process: a key found there is not
    benchmarked again but runs the recorded configuration, so a resumed run launches every kernel with the
    blocks it had (the same rounding). Entries whose kernel, key or configuration this version does not know
    (renamed kernels, changed tuning spaces) are skipped: those keys tune afresh."""
    if not isinstance(choices, dict):
        raise TypeError(f"choices must be a dict from autotune_choices(), got {type(choices).__name__}")
    importlib.import_module(__name__.rpartition(".")[0])   # every kernel module, so every autotuner exists
    tuners = _autotuners()
    for name, per_key in choices.items():
        tuner = tuners.get(name)
        if tuner is None or not isinstance(per_key, dict):
            continue
        for key_repr, wanted in per_key.items():
            config = next((c for c in tuner.configs if c.all_kwargs() == wanted), None)
            try:
                key = ast.literal_eval(key_repr)
            except (ValueError, SyntaxError):
                continue
            if config is not None and isinstance(key, tuple):
                tuner.cache[key] = config


def check_param(name: str, t: Optional[torch.Tensor], like: torch.Tensor, shape: Optional[Sequence[Optional[int]]] = None,
                ) -> Optional[torch.Tensor]:
    """A parameter of a kernel that accepts fp32 weights (module docstring): a floating tensor of ``shape``
    (None: any; sizes None: any) on ``like``'s device, in ``like``'s dtype or float32. None passes."""
    if t is None:
        return None
    check_tensor(name, t, shape=shape)
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like the input, got {t.device}")
    if t.dtype not in (like.dtype, torch.float32):
        raise TypeError(f"{name} must have dtype {like.dtype} like the input, or torch.float32, got {t.dtype}")
    return t


#: constexpr twin of INTERPRET for jit code.
_INTERPRETED = tl.constexpr(INTERPRET)


@triton.jit
def round_to(v, DTYPE: tl.constexpr):
    """``v`` (e.g. an fp32 parameter as loaded) in ``DTYPE``, rounded to nearest even as ``Tensor.to``
    rounds: the kernels convert fp32 parameters to the activations' dtype with it. In the interpreter,
    whose fp32 -> bf16 cast truncates, the bf16 rounding is done on the bits (NaN kept)."""
    if _INTERPRETED and DTYPE == tl.bfloat16 and v.dtype == tl.float32:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out = bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(v != v, v.to(tl.bfloat16), out)
    else:
        return v.to(DTYPE)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """torch dtype of accumulators, partial buffers and saved statistics: fp32, fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    """The Triton dtype of a torch dtype."""
    return _TL_DTYPES[dtype]


def dot_operand_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand dtype of ``tl.dot``: the input's, except bf16 in the interpreter, whose dot multiplies the
    raw uint16 bit patterns (triton 3.9); there the bf16 values go in as fp32 -- the same products,
    since a product of two bf16 values is exact in fp32, as on tensor cores."""
    return tl.float32 if INTERPRET and dtype == torch.bfloat16 else _TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of every ``tl.dot`` for inputs of ``dtype``: the policy in the module docstring."""
    if dtype == torch.float64:
        return "ieee"
    if dtype != torch.float32:
        return "tf32"  # moot for 16-bit operands: Triton's own default
    if torch.version.hip:
        return "ieee"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dtype_constants(dtype: torch.dtype) -> dict:
    """The dtype-dependent constexprs every kernel takes: ACC (accumulator), DOT_DTYPE (dot operands),
    DOT_PRECISION (``tl.dot`` input precision)."""
    return {"ACC": tl_dtype(accumulator_dtype(dtype)), "DOT_DTYPE": dot_operand_dtype(dtype),
            "DOT_PRECISION": dot_precision(dtype)}


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (sizes the split reductions)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def register(name: str, impl: Callable, schema: str, fake: Callable):
    """Register ``fastqa_triton::<name>`` (device types unrestricted: CPU tensors run under
    TRITON_INTERPRET=1) with its fake (shape-only) implementation for torch.compile / export."""
    op = torch.library.custom_op(f"fastqa_triton::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


@triton.jit
def tile_range(start, BLOCK: tl.constexpr, size):
    """The offsets start + [0, BLOCK) of one tile of a dimension of ``size``, and which are in range
    (a jit helper: kernels of every op call it, Triton inlines it)."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < size


def bucket(n: int, cap: Optional[int] = None) -> int:
    """Power-of-two bucket of a size for an autotuning key (re-tune per bucket, not per value)."""
    b = triton.next_power_of_2(max(n, 1))
    return b if cap is None else min(b, cap)
