"""Argument checks shared by the ops: every message names the argument and what was expected."""
from __future__ import annotations

from typing import Sequence

import torch


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    floating: bool = True,
    dtype: torch.dtype | None = None,
    like: torch.Tensor | None = None,
) -> torch.Tensor:
    """Validate ``t`` and return it.

    shape: expected sizes, None for "any"; like: a tensor whose device (and, for floating tensors,
    dtype) ``t`` must share.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is None and shape is not None:
        ndim = len(shape)
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(t.shape, shape)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name} must have shape {_fmt_shape(shape)}, got {tuple(t.shape)} (dimension {axis})")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name} must be on {like.device} like the input, got {t.device}")
        if floating and t.dtype != like.dtype:
            raise TypeError(f"{name} must have dtype {like.dtype} like the input, got {t.dtype}")
    return t


def check_optional(name: str, t: object, **kwargs) -> torch.Tensor | None:
    return None if t is None else check_tensor(name, t, **kwargs)


def check_nonempty_batch(name: str, t: torch.Tensor) -> None:
    if t.shape[0] == 0:
        raise ValueError(f"{name} must have a non-empty batch, got shape {tuple(t.shape)}")


def check_positive(name: str, t: torch.Tensor, axes: Sequence[int]) -> None:
    for axis in axes:
        if t.shape[axis] == 0:
            raise ValueError(f"{name} must have a non-zero size in dimension {axis}, got shape {tuple(t.shape)}")


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels need data: a meta (or other data-less) tensor would otherwise slip through to the
    reference as an automatic fallback."""
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a CPU or CUDA tensor, got a tensor on {t.device}")
