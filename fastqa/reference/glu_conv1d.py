"""Pure-PyTorch GLU convolution (ConvS2S), causal and centred, and its one-step decode; the tutorials'
naive causal form is kept only as a benchmark baseline."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SQRT_HALF = math.sqrt(0.5)


def glu_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, causal: bool,
               residual: bool = True, scale: float = SQRT_HALF, mask: torch.Tensor | None = None) -> torch.Tensor:
    """y = (GLU(conv(pad(x·mask))) + x) · scale   (or GLU(...) · scale without the residual).

    x: [B, T, H]; weight: [2H, H, K]; bias: [2H]; mask: [B, T] bool, True = real token (padded
    positions are zeroed before the conv; the residual is the unmasked x, as in fairseq).
    causal: K-1 zeros on the left; centred: K odd, (K-1)/2 zeros each side. GLU in F.glu order:
    [a; b] = conv(...) split along channels, g = a·sigmoid(b). Returns [B, T, H].
    """
    k = weight.shape[-1]
    h = x if mask is None else x.masked_fill(~mask.unsqueeze(-1), 0)
    pad = (k - 1, 0) if causal else ((k - 1) // 2, (k - 1) // 2)
    g = F.glu(F.conv1d(F.pad(h.transpose(1, 2), pad), weight, bias), dim=1).transpose(1, 2)
    return (g + x) * scale if residual else g * scale


def glu_conv1d_naive(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     causal: bool = True) -> torch.Tensor:
    """The tutorials' / fairseq fconv causal conv: K-1 zeros on *both* sides, the future outputs
    computed and thrown away. Benchmark baseline of the causal op only (``causal`` is accepted for
    ``glu_conv1d``'s signature); residual and scale sqrt(0.5) as ``glu_conv1d``'s defaults."""
    k, t = weight.shape[-1], x.shape[1]
    h = F.conv1d(x.transpose(1, 2), weight, bias, padding=k - 1)[..., :t]
    return (F.glu(h, dim=1).transpose(1, 2) + x) * SQRT_HALF


def glu_conv1d_step(x_t: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, *, residual: bool = True,
                    scale: float = SQRT_HALF) -> tuple[torch.Tensor, torch.Tensor]:
    """One position of the causal op.

    x_t: [B, H]; state: [B, K-1, H], the K-1 previous inputs (zeros before the sequence starts).
    Returns (y_t [B, H], new_state [B, K-1, H]); stepping through a sequence reproduces
    ``glu_conv1d(..., causal=True)`` position by position.
    """
    window = torch.cat([state, x_t.unsqueeze(1)], dim=1)  # [B, K, H], oldest first
    pre = torch.einsum("bkh,ohk->bo", window, weight)
    if bias is not None:
        pre = pre + bias
    g = F.glu(pre, dim=-1)
    y = (g + x_t) * scale if residual else g * scale
    return y, window[:, 1:]


class GLUConv1d(nn.Module):
    """GLU convolution block on [B, T, H] data. Parameter: ``conv`` = nn.Conv1d(H, 2H, K) (padding
    is applied by the op, not the conv)."""

    def __init__(self, channels: int, kernel_size: int, *, causal: bool, residual: bool = True,
                 scale: float = SQRT_HALF, bias: bool = True) -> None:
        super().__init__()
        if not causal and kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd for centred (causal=False) padding, got {kernel_size}")
        self.causal = causal
        self.residual = residual
        self.scale = scale
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(channels, 2 * channels, kernel_size, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, H]; mask: [B, T] bool or None -> [B, T, H]."""
        return glu_conv1d(x, self.conv.weight, self.conv.bias, causal=self.causal, residual=self.residual,
                          scale=self.scale, mask=mask)

    def initial_state(self, batch_size: int, *, device=None, dtype=None) -> torch.Tensor:
        """Zero decode state [B, K-1, H] for ``step``."""
        w = self.conv.weight
        return torch.zeros(batch_size, self.kernel_size - 1, w.shape[1],
                           device=device or w.device, dtype=dtype or w.dtype)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x_t: [B, H]; state: [B, K-1, H] -> (y_t [B, H], new_state). Causal layers only."""
        if not self.causal:
            raise ValueError("step() needs a causal GLUConv1d (causal=True)")
        return glu_conv1d_step(x_t, state, self.conv.weight, self.conv.bias, residual=self.residual,
                               scale=self.scale)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, residual={self.residual}, scale={self.scale:.4g}"
