"""Drop-in GLU convolution block running the fused kernels."""
from __future__ import annotations

import torch
from torch.nn.utils.weight_norm import WeightNorm

from ..ops.glu_conv1d import glu_conv1d, glu_conv1d_step
from ..reference.glu_conv1d import SQRT_HALF
from ..reference.glu_conv1d import GLUConv1d as _ReferenceGLUConv1d

__all__ = ["GLUConv1d"]


class GLUConv1d(_ReferenceGLUConv1d):
    """GLU convolution block on [B, T, H] data: ``fastqa.reference.GLUConv1d`` with fused kernels.

    Same parameters and state_dict as the reference (``conv`` = nn.Conv1d(H, 2H, K)), so weights load
    both ways; ``backend`` is "auto", "reference", "cpu" or "triton". Weight norm on ``.conv`` works in
    both forms: ``torch.nn.utils.parametrizations.weight_norm`` (``conv.weight`` recomputed on access) and
    the older ``torch.nn.utils.weight_norm``, whose hook only runs inside ``conv.forward`` -- which this
    block never calls, so it recomputes the weight itself.
    """

    def __init__(self, channels: int, kernel_size: int, *, causal: bool, residual: bool = True,
                 scale: float = SQRT_HALF, bias: bool = True, backend: str = "auto") -> None:
        super().__init__(channels, kernel_size, causal=causal, residual=residual, scale=scale, bias=bias)
        self.backend = backend

    def _weight(self) -> torch.Tensor:
        """conv.weight [2H, H, K], refreshed from weight_g / weight_v under the old-style weight norm."""
        for hook in self.conv._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm):
                return hook.compute_weight(self.conv)
        return self.conv.weight

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, H]; mask: [B, T] bool or None -> [B, T, H]."""
        return glu_conv1d(x, self._weight(), self.conv.bias, causal=self.causal, residual=self.residual,
                          scale=self.scale, mask=mask, backend=self.backend)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_t: [B, H]; state: [B, K-1, H] -> (y_t [B, H], new_state). Causal layers only; forward-only
        fused kernel when nothing needs a gradient (see ``fastqa.ops.glu_conv1d_step``)."""
        if not self.causal:
            raise ValueError("step() needs a causal GLUConv1d (causal=True)")
        return glu_conv1d_step(x_t, state, self._weight(), self.conv.bias, residual=self.residual,
                               scale=self.scale, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
