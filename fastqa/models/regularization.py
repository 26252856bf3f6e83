"""Regularisation in plain PyTorch: sublayer dropout with a cheap mask, stochastic depth (per-example survival
factors) and the dropout-add of the models' pure-PyTorch layer sets."""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .. import reference
from ..reference.dropout_add import drop_threshold
from .device import buffer_in, host_to_device

__all__ = ["StochasticDepth", "TorchDropoutAdd", "dropout", "survival_prob", "survival_scales"]


def survival_prob(index: int, total: int, layer_dropout: float) -> float:
    """Stochastic depth (Huang et al. 2016, as in QANet): sublayer ``index`` (1..total) survives with
    probability 1 - (index / total) * layer_dropout."""
    return 1.0 - index / total * layer_dropout


def _keep_mask(shape: torch.Size, p: float, device: torch.device,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, float]:
    """Bool [shape] dropout keep-mask, P(keep) = 1 - p quantised to 1/65536, and that probability.

    Random int64 words viewed as four int16 each: one generator draw per four elements instead of one
    per element (``bernoulli_`` costs ~10x more on the CPU, where dropout masks were a tenth of a QANet
    train step).
    """
    numel = math.prod(shape)
    drop = drop_threshold(p)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((numel + 3) // 4,), dtype=torch.int64, device=device,
                          generator=generator)
    keep = words.view(torch.int16)[:numel] >= drop - 32768
    return keep.view(shape), 1.0 - drop / 65536


def dropout(x: torch.Tensor, p: float, training: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Inverted dropout (as F.dropout, with p quantised to 1/65536 and a cheaper mask, see ``_keep_mask``)."""
    if not training or p == 0.0:
        return x
    keep, q = _keep_mask(x.shape, p, x.device, generator)
    return torch.where(keep, x, 0.0).mul_(1.0 / q)  # where, not x * keep: no float copy of the mask


def survival_scales(batch: int, survival: Sequence[float], *, device: torch.device,
                    dtype: torch.dtype) -> torch.Tensor | None:
    """Stochastic depth's per-example factors of S sublayers: [S, batch], 0 where sublayer i's branch is
    dropped for that example (probability 1 - survival[i]), 1 / survival[i] where it is kept (so evaluation
    adds the branch as it is); None when every survival is 1. Per example, not per batch, so every parameter
    takes part in every step, as DistributedDataParallel needs. (A model's blocks draw theirs through a
    ``StochasticDepth``, whose constants are built once.)"""
    if all(s == 1.0 for s in survival):
        return None
    surv = host_to_device(torch.tensor(survival, dtype=torch.float32), device).view(len(survival), 1)
    inverse = (1.0 / surv).to(dtype)
    return _draw_scales(batch, surv, inverse, inverse.new_zeros(()))


def _draw_scales(batch: int, survival: torch.Tensor, inverse: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """survival: [S, 1] float32; inverse: [S, 1], 1 / survival rounded to the scales' dtype; zero: a 0-d zero in
    that dtype -> [S, batch]."""
    # Drawn in float32 whatever the dtype: the same seed gives the same draws in every precision.
    keep = torch.rand(survival.shape[0], batch, device=survival.device) < survival
    # Exactly the inverse or 0, picked: a product with the bool mask would first copy it to the scales' dtype.
    return torch.where(keep, inverse, zero)


class StochasticDepth(nn.Module):
    """``survival_scales`` of fixed survival probabilities, their constants built once as device buffers (not
    per call from a fresh host tensor, which a captured CUDA graph would replay stale): ``depth(batch, dtype)``
    -> [S, batch] or None when every survival is 1. Non-persistent buffers: no state_dict entry.

    The survival probabilities are kept as their float32 bit patterns (int32), out of reach of ``model.to(dtype)``:
    the draws compare with the float32 values in every precision. Their inverses follow the model's dtype as
    the factors do, cast once under autocast (``buffer_in``)."""

    def __init__(self, survival: Sequence[float]) -> None:
        super().__init__()
        self.active = any(s != 1.0 for s in survival)
        surv = torch.tensor(list(survival), dtype=torch.float32).view(-1, 1)
        self.register_buffer("survival_bits", surv.view(torch.int32), persistent=False)
        self.register_buffer("inverse", 1.0 / surv, persistent=False)
        self.register_buffer("zero", torch.zeros(()), persistent=False)   # where() picks it for a dropped branch

    def forward(self, batch: int, dtype: torch.dtype) -> torch.Tensor | None:
        if not self.active:
            return None
        return _draw_scales(batch, self.survival_bits.view(torch.float32), buffer_in(self, "inverse", dtype),
                            buffer_in(self, "zero", dtype))


class TorchDropoutAdd(reference.DropoutAdd):
    """``fastqa.reference.DropoutAdd`` with its masks drawn from torch's generator (``_keep_mask``) instead of
    hashed from a seed: the models' pure-PyTorch layer sets. (The reference layer reproduces the fused
    layer's masks bit for bit, but with ~15 integer passes per call it would make a slow baseline.)"""

    SEEDED = False   # no seed: a model shares no DropoutSeeds with it

    def apply_dropout(self, branch: torch.Tensor, residual: torch.Tensor | None, example_scale: torch.Tensor | None,
                      generator: torch.Generator | None) -> torch.Tensor:
        branch = dropout(branch, self.p, True, generator)
        if example_scale is None:
            return branch if residual is None else residual + branch
        scale = example_scale.view(-1, *([1] * (branch.dim() - 1)))
        return branch * scale if residual is None else torch.addcmul(residual, branch, scale)

