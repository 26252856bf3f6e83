"""Learning-rate schedules as ``torch.optim.lr_scheduler.LambdaLR`` (so they checkpoint like any scheduler)."""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["log_warmup", "inverse_sqrt"]


def log_warmup(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LambdaLR:
    """QANet's warm-up: lr_t = lr · min(1, log(t + 1) / log(warmup_steps)) for steps t = 1, 2, ...

    The scheduler's step counter starts at 0 before the first optimizer step, so the first step runs
    at log(2)/log(warmup) of the base rate (never at 0)."""
    if warmup_steps < 2:
        raise ValueError(f"warmup_steps must be >= 2, got {warmup_steps}")
    scale = 1.0 / math.log(warmup_steps)
    return LambdaLR(optimizer, lambda t: min(1.0, math.log(t + 2) * scale))


def inverse_sqrt(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LambdaLR:
    """Linear warm-up over ``warmup_steps``, then lr ∝ 1/sqrt(step)."""
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
    return LambdaLR(optimizer, lambda t: min((t + 1) / warmup_steps, math.sqrt(warmup_steps / (t + 1))))
