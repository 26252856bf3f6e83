"""fastqa: fused kernels of QANet and ConvS2S (depthwise-separable and GLU convolutions, trilinear similarity and
context-query attention, self-attention, dropout + residual, projections and a fused argmax, one-step decoding)
and the two models, for question answering and translation.

Functional ops live in ``fastqa.ops`` (re-exported here), drop-in modules in ``fastqa.layers``, the pure-PyTorch
references in ``fastqa.reference``, the models in ``fastqa.models``, the tasks (``QAModel``, ``Translator``) in
``fastqa.tasks``. ``fastqa.info()`` says which backends are usable.

The names below load on first use (PEP 562), so ``fastqa --help`` and the task commands start without
importing torch before they need it; ``import fastqa.ops`` (or any op's use) registers the custom ops.
"""
from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

_OPS = ("context_query_attention", "decode_attention", "dropout_add", "dwsep_conv1d", "glu_conv1d",
        "glu_conv1d_step", "linear", "linear_argmax", "ln_dwsep_conv1d", "self_attention", "trilinear_similarity")
_SUBMODULES = ("layers", "ops", "reference")
_BACKEND = ("BACKENDS", "info")

__all__ = ["BACKENDS", "info", "__version__", "layers", "ops", "reference", *_OPS]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _OPS:
        return getattr(importlib.import_module(".ops", __name__), name)
    if name in _BACKEND:
        return getattr(importlib.import_module("._backend", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
