"""Pure-PyTorch depthwise-separable conv1d (and its pre-LayerNorm variant): the ground truth and fallback of
``fastqa.dwsep_conv1d`` and ``fastqa.ln_dwsep_conv1d``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PADDINGS = ("same", "causal")
ACTIVATIONS = (None, "relu")


def conv_padding(kernel_size: int, padding: str) -> tuple[int, int]:
    """(left, right) zero padding that keeps the length: 'same' as nn.Conv1d(padding='same')
    (the extra zero of an even kernel goes right), 'causal' all K-1 on the left."""
    if padding == "same":
        left = (kernel_size - 1) // 2
        return left, kernel_size - 1 - left
    if padding == "causal":
        return kernel_size - 1, 0
    raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")


def dwsep_conv1d(
    x: torch.Tensor,
    dw_weight: torch.Tensor,
    pw_weight: torch.Tensor,
    pw_bias: torch.Tensor | None = None,
    *,
    dw_bias: torch.Tensor | None = None,
    padding: str = "same",
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = act(pointwise(depthwise(x))) (+ residual).

    x: [B, L, C_in]; dw_weight: [C_in, 1, K]; dw_bias: [C_in]; pw_weight: [C_out, C_in, 1];
    pw_bias: [C_out]; residual: [B, L, C_out]; mask: [B, L] bool, False = padding: those rows of x enter
    the depthwise conv as zeros, like the conv's own zero padding (the residual is not masked). Returns
    [B, L, C_out].
    """
    if mask is not None:
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
    left, right = conv_padding(dw_weight.shape[-1], padding)
    h = F.conv1d(F.pad(x.transpose(1, 2), (left, right)), dw_weight, dw_bias, groups=x.shape[-1])
    y = F.linear(h.transpose(1, 2), pw_weight.squeeze(-1), pw_bias)
    if activation == "relu":
        y = F.relu(y)
    elif activation is not None:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if residual is not None:
        y = y + residual
    return y


def ln_dwsep_conv1d(x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor, *conv_args,
                    eps: float = 1e-5, **conv_options) -> torch.Tensor:
    """``dwsep_conv1d(LayerNorm(x), *conv_args, **conv_options)``: QANet's conv sublayer, by definition.

    The LayerNorm is over the channels (x: [B, L, C_in]; ln_weight, ln_bias: [C_in]) and comes before
    the zero padding and the mask (the normalised padding rows are zeroed); the other arguments are
    ``dwsep_conv1d``'s (dw_weight, pw_weight, pw_bias, and its keywords). Returns [B, L, C_out].
    """
    h = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps)
    return dwsep_conv1d(h, *conv_args, **conv_options)


class DepthwiseSeparableConv1d(nn.Module):
    """Depthwise conv (kernel K, one filter per channel) then pointwise 1x1 conv, on [B, L, C] data.

    Parameters are two ``nn.Conv1d``: ``depthwise`` (weight [C_in, 1, K], bias off by default, as in
    QANet) and ``pointwise`` (weight [C_out, C_in, 1], bias [C_out]).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, bias: bool = True,
                 depthwise_bias: bool = False, activation: str | None = None, padding: str = "same") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        conv_padding(kernel_size, padding)  # validates padding
        self.activation = activation
        self.padding = padding
        self.depthwise = nn.Conv1d(in_channels, in_channels, kernel_size, groups=in_channels, bias=depthwise_bias)
        self.pointwise = nn.Conv1d(in_channels, out_channels, 1, bias=bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, L, C_in]; residual: [B, L, C_out] or None; mask: [B, L] bool (False = padding, read as
        zeros by the conv) or None -> [B, L, C_out]."""
        return dwsep_conv1d(x, self.depthwise.weight, self.pointwise.weight, self.pointwise.bias,
                            dw_bias=self.depthwise.bias, padding=self.padding, activation=self.activation,
                            residual=residual, mask=mask)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, padding={self.padding!r}"


class LayerNormDepthwiseSeparableConv1d(DepthwiseSeparableConv1d):
    """LayerNorm over the channels, then ``DepthwiseSeparableConv1d``, on [B, L, C] data.

    Parameters: ``norm`` (``nn.LayerNorm(in_channels, eps=eps)``) plus ``depthwise`` and ``pointwise``
    exactly as in ``DepthwiseSeparableConv1d``. QANet's conv sublayer is ``layer(x, residual=x)``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, bias: bool = True,
                 depthwise_bias: bool = False, activation: str | None = None, padding: str = "same",
                 eps: float = 1e-5) -> None:
        super().__init__(in_channels, out_channels, kernel_size, bias=bias, depthwise_bias=depthwise_bias,
                         activation=activation, padding=padding)
        self.norm = nn.LayerNorm(in_channels, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, L, C_in]; residual: [B, L, C_out] or None; mask: [B, L] bool (False = padding, zero after
        the LayerNorm) or None -> [B, L, C_out]."""
        return ln_dwsep_conv1d(x, self.norm.weight, self.norm.bias, self.depthwise.weight, self.pointwise.weight,
                               self.pointwise.bias, dw_bias=self.depthwise.bias, eps=self.norm.eps,
                               padding=self.padding, activation=self.activation, residual=residual, mask=mask)
