"""Pure-PyTorch linear map: the ground truth and fallback of ``fastqa.linear`` (``F.linear``) and of
``fastqa.linear_argmax``; its module is ``nn.Linear`` with an ``argmax`` method."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] = x Wᵀ + b."""
    return F.linear(x, weight, bias)


def linear_argmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  exclude: Sequence[int] = ()) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [...] int64: argmax over N of x Wᵀ + b, the features in
    ``exclude`` never chosen: the first allowed id holding the largest allowed logit, a NaN counting as the
    largest (torch.argmax's rule), so a row whose allowed logits are all -inf gives the lowest allowed id.
    Excluding every id is a ValueError naming ``exclude``."""
    y = F.linear(x, weight, bias)
    if not len(exclude):
        return y.argmax(-1)
    excluded = set(exclude)
    allowed = [i for i in range(y.shape[-1]) if i not in excluded]
    if not allowed:
        raise ValueError(f"exclude leaves none of the {y.shape[-1]} output features to choose")
    # argmax over the allowed columns only: no -inf fill that an all -inf row could tie with.
    index = torch.tensor(allowed, device=y.device)
    return index[y.index_select(-1, index).argmax(-1)]


class Linear(nn.Linear):
    """``nn.Linear`` plus ``argmax(x, exclude)``: the index of the largest output feature (greedy decoding)."""

    def argmax(self, x: torch.Tensor, exclude: Sequence[int] = ()) -> torch.Tensor:
        """x: [..., in_features] -> [...] int64, see ``linear_argmax``."""
        return linear_argmax(x, self.weight, self.bias, exclude)
