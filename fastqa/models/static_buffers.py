"""What the models' static-buffer steps share: one holder per model and thread, the model held weakly.

A holder (QANet's ``GraphedReader``, ConvS2S's ``StaticDecoding``) keeps a model's static buffers and, on CUDA,
the graphs captured over them in one memory pool. ``Holder.of(model)`` returns the calling thread's holder for
``model`` -- two threads must not share buffers -- and the holders live exactly as long as the model.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

from torch import nn


class PerModelStatic:
    """Base of a model's static-buffer holder. capture: capture graphs (default: on CUDA; True needs CUDA)."""

    _per_model: "weakref.WeakKeyDictionary[nn.Module, dict[int, PerModelStatic]]"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._per_model = weakref.WeakKeyDictionary()   # each kind of holder its own registry

    def __init__(self, model: nn.Module, *, capture: bool | None = None) -> None:
        # Weakly: the per-model registry holds this object as long as the model lives, and no longer.
        self._model = weakref.ref(model)
        device = next(model.parameters()).device
        self.capture = device.type == "cuda" if capture is None else bool(capture)
        if self.capture and device.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA model, got one on {device}")
        self.pool: Any = None   # the graphs' shared memory pool, from the first capture
        self.replays = 0

    @property
    def model(self) -> Any:
        model = self._model()
        if model is None:
            raise RuntimeError("the model of these static buffers is gone")
        return model

    @classmethod
    def of(cls, model: nn.Module) -> Any:
        """The calling thread's holder for ``model`` (made on first use)."""
        per_thread = cls._per_model.setdefault(model, {})
        found = per_thread.get(threading.get_ident())
        if found is None:
            found = per_thread[threading.get_ident()] = cls(model)
        return found
