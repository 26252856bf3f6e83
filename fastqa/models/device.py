"""Where a model's tensors live: small host tensors sent to the device without a host wait, constant buffers
cast once per dtype, and whether the host may read device values for free."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["buffer_in", "host_to_device", "reads_are_free"]


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor built from Python values, on ``device``. To a GPU through pinned memory and a
    non-blocking copy: a plain ``.to("cuda")`` of pageable memory makes the host wait for the stream (a host
    sync per call, several per train step)."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        # Under torch.compile the values are constants of the graph (and dynamo cannot trace pin_memory).
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def buffer_in(module: nn.Module, name: str, dtype: torch.dtype) -> torch.Tensor:
    """``module``'s buffer ``name`` in ``dtype`` (a model's constant under autocast): cast once and kept on the module
    while the buffer is the same (device, storage, version), not cast per call."""
    buffer = getattr(module, name)
    if buffer.dtype == dtype or torch.compiler.is_compiling():
        return buffer.to(dtype)
    key = (dtype, buffer.device, buffer.data_ptr(), buffer._version)
    kept = module.__dict__.setdefault("_buffer_casts", {})
    if name not in kept or kept[name][0] != key:
        kept[name] = (key, buffer.to(dtype))
    return kept[name][1]


def reads_are_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's values on ``device`` (a count, ``nonzero``) without waiting for the
    device: True on the CPU, False on a GPU, where the models decide such things without reading -- and False
    while ``torch.compile`` traces, whose graph holds no host read (a read would break it in two)."""
    return device.type != "cuda" and not torch.compiler.is_compiling()

