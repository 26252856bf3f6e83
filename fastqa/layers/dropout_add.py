"""Drop-in sublayer dropout + residual add running the seeded one-pass kernel."""
from __future__ import annotations

import torch

from ..ops.dropout_add import dropout_add
from ..reference.dropout_add import DropoutAdd as _ReferenceDropoutAdd

__all__ = ["DropoutAdd"]


class DropoutAdd(_ReferenceDropoutAdd):
    """``fastqa.reference.DropoutAdd`` (no parameters; the same masks for the same seed) computed by
    ``fastqa.dropout_add``: the mask, the scale and the add in one pass, nothing stored for the backward.
    ``backend``: "auto", "reference", "cpu" or "triton"."""

    def __init__(self, p: float, backend: str = "auto") -> None:
        super().__init__(p)
        self.backend = backend

    def apply_dropout(self, branch: torch.Tensor, residual: torch.Tensor | None, example_scale: torch.Tensor | None,
                      generator: torch.Generator | None) -> torch.Tensor:
        return dropout_add(branch, self.p, self.seed(branch.device, generator), residual, example_scale,
                           backend=self.backend)
