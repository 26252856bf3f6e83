"""Exponential moving average of a model's weights (QANet evaluates and predicts with it)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    """shadow <- d·shadow + (1 - d)·param after every optimizer step, with d = min(decay, (1+t)/(10+t)):
    the warm-up term keeps a short run's average from being dominated by the random initial weights.
    Floating buffers (e.g. LayerNorm has none, BatchNorm would) are averaged too; others are copied.
    Frozen parameters (``requires_grad=False``, e.g. QANet's word vectors: 27M floats in the paper preset)
    never change, so they are kept once and skipped by every update."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.frozen = {name for name, p in model.named_parameters() if not p.requires_grad}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for k, v in model.state_dict().items():
            if k in self.frozen:
                continue
            s = self.shadow[k]
            if v.is_floating_point():
                s.lerp_(v.detach(), 1.0 - d)
            else:
                s.copy_(v)

    def state_dict(self) -> dict:
        return dict(self.shadow)

    def load_state_dict(self, state: dict, updates: int) -> None:
        for k, v in state.items():
            self.shadow[k].copy_(v)
        self.updates = updates

    @contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[nn.Module]:
        """The model with the EMA weights for the duration of the block, its own weights restored after."""
        # Frozen parameters equal their shadow: neither saved nor swapped (no copy of a 27M-float word table).
        saved = {k: v.detach().clone() for k, v in model.state_dict().items() if k not in self.frozen}
        model.load_state_dict({k: v for k, v in self.shadow.items() if k not in self.frozen}, strict=False)
        try:
            yield model
        finally:
            model.load_state_dict(saved, strict=False)
