"""Pure-PyTorch linear map: the ground truth and fallback of ``fastqa.linear`` (``F.linear``); its module is
``nn.Linear`` itself."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

Linear = nn.Linear


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] = x Wᵀ + b."""
    return F.linear(x, weight, bias)
