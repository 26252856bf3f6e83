"""Drop-in nn.Linear whose products run on the GEMM engine measured fastest for their shape."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..ops.linear import linear, linear_argmax

__all__ = ["Linear"]


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, state_dict and initialisation) computed by ``fastqa.linear``: on the
    CPU each product (forward, grad_x, grad_weight) runs on the engine -- BLAS or torch's oneDNN -- that
    was measured fastest for its shape. Weight normalisation (``torch.nn.utils.parametrizations``) works
    as on nn.Linear. ``backend``: "auto", "reference", "cpu" or "triton" (the GPU path)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, backend: str = "auto",
                 device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] (at least 2 dimensions) -> [..., out_features]."""
        return linear(x, self.weight, self.bias, backend=self.backend)

    def argmax(self, x: torch.Tensor, exclude: Sequence[int] = ()) -> torch.Tensor:
        """x: [..., in_features] -> [...] int64: the index of the largest output feature, never one of
        ``exclude`` (greedy decoding's next token; see ``fastqa.linear_argmax``)."""
        return linear_argmax(x, self.weight, self.bias, exclude, backend=self.backend)
