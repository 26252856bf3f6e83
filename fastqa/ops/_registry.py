"""Where each backend's kernels live, so the autograd Functions stay backend-agnostic (and nothing else).

Every op ``<name>`` has, per compiled backend, a pair of custom ops with identical schemas:
``<ns>::<name>_fwd`` and ``<ns>::<name>_bwd``, where ``ns`` is ``fastqa`` for the C++ CPU kernels
(registered by ``fastqa._C`` with TORCH_LIBRARY) and ``fastqa_triton`` for the Triton kernels
(registered by ``fastqa.triton_kernels.<module>`` with torch.library.custom_op). What a forward
saves for its backward (its "aux" outputs) is the backend's own business: the Function stores them
and hands them back unread.

Each op's declaration (``fastqa.ops._declare``) registers its autograd formula on its ``<ns>::<name>_fwd`` ops
(``register_autograd_hook``): at once for the C++ ops, and for the Triton ops when their module is
imported (``register_triton_autograd``, called by ``fastqa.ops`` after importing the kernels).
"""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

import torch

from .._backend import cpu_available, resolve_backend
from .._checks import autocast_dtype
from ._torch_private import below_autograd

_NAMESPACES = {"cpu": "fastqa", "triton": "fastqa_triton"}
_AUTOGRAD_HOOKS: dict[str, list[Callable[[str], None]]] = {}


def cpu_statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the statistics a C++ kernel saves for its backward (a log-sum-exp, softmax probabilities, a
    LayerNorm mean and 1/std), given its input's: float32 for bfloat16, what they are computed in; the input's
    otherwise. What the fake kernels declare (the kernels' rule: ``bf16::statistics_dtype``, csrc/cpu/bf16.h)."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def qualified(backend: str, name: str) -> str:
    """The custom op's qualified name, e.g. qualified("cpu", "glu_conv1d_fwd") == "fastqa::glu_conv1d_fwd"."""
    return f"{_NAMESPACES[backend]}::{name}"


def register_autograd_hook(module: str, hook: Callable[[str], None]) -> None:
    """``hook(backend)`` registers the autograd formulas of kernel module ``module``'s ops for a backend:
    run now for "cpu" where the extension is built, and for "triton" by ``register_triton_autograd``."""
    _AUTOGRAD_HOOKS.setdefault(module, []).append(hook)
    if cpu_available():
        hook("cpu")


def register_triton_autograd(module: str | None = None) -> None:
    """Register the autograd formulas of the Triton ops of ``module`` (all modules: None); the kernel
    modules must have been imported. Idempotent."""
    for name, hooks in _AUTOGRAD_HOOKS.items():
        if module is None or name == module:
            for hook in hooks:
                hook("triton")


def kernel(backend: str, module: str, name: str) -> Any:
    """The custom op ``name`` of ``backend`` (e.g. kernel("cpu", "dwsep_conv1d", "dwsep_conv1d_fwd")).

    ``module`` is the kernel module (under ``fastqa.triton_kernels``) whose import registers the
    Triton ops; the C++ ops are registered when ``fastqa._C`` loads.
    """
    if backend == "triton" and not torch.compiler.is_compiling():
        # Usually a no-op (fastqa.ops imports the kernels where Triton can run); dynamo cannot trace
        # an import, and by the time a graph is traced the ops are registered.
        importlib.import_module(f"fastqa.triton_kernels.{module}")
        register_triton_autograd(module)
    op = getattr(getattr(torch.ops, _NAMESPACES[backend]), name)
    if torch.compiler.is_compiling():
        return op
    return functools.partial(_below_autograd, op)


def exported_op(backend: str, name: str) -> Any:
    """The custom op ``name`` of ``backend`` itself, its Autograd kernel included (the formula
    ``register_op_autograd`` put there): what the entry points call while ``torch.export`` traces."""
    return getattr(getattr(torch.ops, _NAMESPACES[backend]), name)


def _below_autograd(op: Any, *args: Any) -> Any:
    """Call ``op`` past its Autograd dispatch key. The callers (the Functions' forward and backward, the
    forward-only decode step) handle gradients themselves, and the Python autograd kernel that
    ``register_op_autograd`` puts on each forward op (for graphs that call the op directly) would only
    re-dispatch -- at ~0.1 ms a call, what a small op's whole kernel takes."""
    with below_autograd():
        return op(*args)


CPU_ACCEPTS_FP32_WEIGHTS = frozenset({"linear", "linear_argmax", "dwsep_conv1d", "ln_dwsep_conv1d",
                                      "trilinear_similarity", "context_query_attention"})
"""The ops whose C++ kernels take float32 parameters with bfloat16 activations (reading them as float32, or
rounding a GEMM's weight once inside the kernel) and return the parameters' gradients in float32: the CPU
backend's ``ACCEPTS_FP32_WEIGHTS``, per op."""


def takes_fp32_params(backend: str, op: str, module: str, x: object) -> bool:
    """Whether ``op`` on the activation ``x`` under autocast runs on kernels that take float32 parameters -- the
    Triton kernels of module ``module`` with ``ACCEPTS_FP32_WEIGHTS``, or the C++ kernels of the ops in
    ``CPU_ACCEPTS_FP32_WEIGHTS`` under bfloat16 autocast: then the entry point passes the float32 master
    weights uncast (``entry_prologue``'s ``fp32_params``). False outside autocast and for any other backend;
    False too for a backend or input the entry point's own checks will refuse."""
    if not isinstance(x, torch.Tensor) or x.device.type not in ("cuda", "cpu"):
        return False
    dtype = autocast_dtype(x.device)
    if dtype is None:
        return False
    kernels = sys.modules.get(f"fastqa.triton_kernels.{module}")   # imported by fastqa.ops where Triton runs
    triton = kernels is not None and getattr(kernels, "ACCEPTS_FP32_WEIGHTS", False)
    cpu = op in CPU_ACCEPTS_FP32_WEIGHTS and dtype == torch.bfloat16
    if not (triton or cpu):
        return False
    try:
        resolved = resolve_backend(backend, op, x.device, dtype)
    except (TypeError, RuntimeError):
        return False
    return (resolved == "triton" and triton) or (resolved == "cpu" and cpu)
