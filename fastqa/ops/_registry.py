"""Where each backend's kernels live, so the autograd Functions stay backend-agnostic (and nothing else).

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
    if backend == "triton" and not torch.compiler.is_compiling():
        # Usually a no-op (fastqa.ops imports the kernels where Triton can run); dynamo cannot trace
        # an import, and by the time a graph is traced the ops are registered.
        importlib.import_module(f"fastqa.triton_kernels.{module}")
    return getattr(getattr(torch.ops, _NAMESPACES[backend]), name)
