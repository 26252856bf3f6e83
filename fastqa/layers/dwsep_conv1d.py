"""Drop-in fused ``DepthwiseSeparableConv1d`` and ``LayerNormDepthwiseSeparableConv1d``: same parameters and
state_dict as the reference modules."""
from __future__ import annotations

import torch

from .. import reference
from ..ops.dwsep_conv1d import dwsep_conv1d, ln_dwsep_conv1d

__all__ = ["DepthwiseSeparableConv1d", "LayerNormDepthwiseSeparableConv1d"]


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

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, L, C_in]; residual: [B, L, C_out] or None; mask: [B, L] bool or None -> [B, L, C_out]."""
        return dwsep_conv1d(x, self.depthwise.weight, self.pointwise.weight, self.pointwise.bias,
                            dw_bias=self.depthwise.bias, padding=self.padding, activation=self.activation,
                            residual=residual, mask=mask, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"


class LayerNormDepthwiseSeparableConv1d(reference.LayerNormDepthwiseSeparableConv1d):
    """LayerNorm over the channels, then depthwise conv (kernel K) and pointwise 1x1 conv (+ bias, activation,
    residual) on [B, L, C] data, as one op (``fastqa.ln_dwsep_conv1d``; fused end to end on Triton, see its
    docstring for the cpu backend). QANet's conv sublayer is ``layer(x, residual=x)``.
    ``backend``: "auto" (default), "reference", "cpu" or "triton".
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, bias: bool = True,
                 depthwise_bias: bool = False, activation: str | None = None, padding: str = "same",
                 eps: float = 1e-5, backend: str = "auto") -> None:
        super().__init__(in_channels, out_channels, kernel_size, bias=bias, depthwise_bias=depthwise_bias,
                         activation=activation, padding=padding, eps=eps)
        self.backend = backend

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, L, C_in]; residual: [B, L, C_out] or None; mask: [B, L] bool or None -> [B, L, C_out]."""
        return ln_dwsep_conv1d(x, self.norm.weight, self.norm.bias, self.depthwise.weight, self.pointwise.weight,
                               self.pointwise.bias, dw_bias=self.depthwise.bias, eps=self.norm.eps,
                               padding=self.padding, activation=self.activation, residual=residual, mask=mask,
                               backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
