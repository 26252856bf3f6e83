"""Drop-in fused ``DepthwiseSeparableConv1d``: same parameters and state_dict as the reference module."""
from __future__ import annotations

import torch

from .. import reference
from ..ops.dwsep_conv1d import dwsep_conv1d

__all__ = ["DepthwiseSeparableConv1d"]


class DepthwiseSeparableConv1d(reference.DepthwiseSeparableConv1d):
    """Depthwise conv (kernel K) then pointwise 1x1 conv (+ bias, activation, residual) on [B, L, C] data,
    run by the fused kernels. ``backend``: "auto" (default), "reference", "cpu" or "triton".
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, bias: bool = True,
                 depthwise_bias: bool = False, activation: str | None = None, padding: str = "same",
                 backend: str = "auto") -> None:
        super().__init__(in_channels, out_channels, kernel_size, bias=bias, depthwise_bias=depthwise_bias,
                         activation=activation, padding=padding)
        self.backend = backend

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, L, C_in]; residual: [B, L, C_out] or None -> [B, L, C_out]."""
        return dwsep_conv1d(x, self.depthwise.weight, self.pointwise.weight, self.pointwise.bias,
                            dw_bias=self.depthwise.bias, padding=self.padding, activation=self.activation,
                            residual=residual, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
