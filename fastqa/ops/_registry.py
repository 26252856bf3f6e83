"""Where each backend's kernels live, so the autograd Functions stay backend-agnostic.

Every op ``<name>`` has, per compiled backend, a pair of custom ops with identical schemas:
``<ns>::<name>_fwd`` and ``<ns>::<name>_bwd``, where ``ns`` is ``fastqa`` for the C++ CPU kernels
(registered by ``fastqa._C`` with TORCH_LIBRARY) and ``fastqa_triton`` for the Triton kernels
(registered by ``fastqa.triton_kernels.<module>`` with torch.library.custom_op). What a forward
saves for its backward (its "aux" outputs) is the backend's own business: the Function stores them
and hands them back unread.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

_NAMESPACES = {"cpu": "fastqa", "triton": "fastqa_triton"}


def kernel(backend: str, module: str, name: str) -> Any:
    """The custom op ``name`` of ``backend`` (e.g. kernel("cpu", "dwsep_conv1d", "dwsep_conv1d_fwd")).

    ``module`` is the kernel module (under ``fastqa.triton_kernels``) whose import registers the
    Triton ops; the C++ ops are registered when ``fastqa._C`` loads.
    """
    if backend == "triton":
        importlib.import_module(f"fastqa.triton_kernels.{module}")
    return getattr(getattr(torch.ops, _NAMESPACES[backend]), name)


def none_if_empty(t: torch.Tensor) -> torch.Tensor | None:
    """Kernels return an empty tensor for the gradient of an absent optional input."""
    return None if t.numel() == 0 else t


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype ``torch.autocast`` asks for on ``device``, or None outside an autocast region.

    Custom ops are invisible to autocast, so the functional entries apply it themselves: under
    autocast, floating inputs run in the autocast dtype, as nn.Conv1d / matmul would.
    """
    if device.type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def cast_floating(dtype: torch.dtype | None, *tensors: torch.Tensor | None) -> tuple:
    """``tensors`` with every floating one cast to ``dtype`` (None: unchanged)."""
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)
