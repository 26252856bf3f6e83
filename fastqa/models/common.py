"""Blocks the models share: the sinusoidal timing signal, a highway network, masked log-softmax,
sublayer residual with dropout and stochastic depth, and the initialisation of linear layers.

Everything here is plain ``torch.nn`` (models import ``fastqa.layers`` and ``torch.nn`` only).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Highway", "init_linear", "masked_log_softmax", "residual_dropout", "survival_prob", "timing_signal"]


def timing_signal(length: int, channels: int, *, device: torch.device | None = None,
                  dtype: torch.dtype = torch.float32, min_timescale: float = 1.0,
                  max_timescale: float = 1.0e4) -> torch.Tensor:
    """Sinusoidal position signal (Vaswani et al. 2017, tensor2tensor layout): [length, channels].

    Channel i < C/2 is sin(pos / timescale_i), channel C/2 + i is cos(pos / timescale_i), timescales
    geometric from min to max (an odd C gets a zero last channel). Computed for any length (in float32,
    then cast), so a model evaluates contexts longer than any it was trained on.
    """
    half = channels // 2
    log_step = math.log(max_timescale / min_timescale) / max(half - 1, 1)
    inv = min_timescale * torch.exp(torch.arange(half, device=device, dtype=torch.float32) * -log_step)
    angles = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1) * inv.unsqueeze(0)
    signal = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if channels % 2:
        signal = F.pad(signal, (0, 1))
    return signal.to(dtype)


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax over the entries where ``mask`` (bool, True = real) holds.

    Masked entries get the dtype's most negative finite logit, so their log-probability is finite
    (never -inf or NaN, also when multiplied by 0) and its exp is exactly 0. logits, mask: same shape.
    """
    return F.log_softmax(logits.masked_fill(~mask, torch.finfo(logits.dtype).min), dim=dim)


def survival_prob(index: int, total: int, layer_dropout: float) -> float:
    """Stochastic depth (Huang et al. 2016, as in QANet): sublayer ``index`` (1..total) survives with
    probability 1 - (index / total) * layer_dropout."""
    return 1.0 - index / total * layer_dropout


def residual_dropout(x: torch.Tensor, branch: torch.Tensor, *, dropout: float, survival: float = 1.0,
                     training: bool) -> torch.Tensor:
    """x + branch with dropout on the branch (the sublayer output) only, never on the residual path.

    In training, ``dropout`` zeroes branch entries and stochastic depth drops the whole branch of each
    example with probability 1 - ``survival`` (per example, so every parameter takes part in every step,
    as DistributedDataParallel needs); kept values are scaled by 1 / ((1 - dropout) * survival), so
    evaluation uses the branch as it is. Both masks are one [B, L, C] multiplier: x + branch * mask.
    x, branch: [B, ...], same shape.
    """
    if not training or (dropout == 0.0 and survival == 1.0):
        return x + branch
    keep_shape = (branch.shape[0],) + (1,) * (branch.dim() - 1)
    mask = branch.new_empty(keep_shape).bernoulli_(survival) if survival < 1.0 else branch.new_ones(keep_shape)
    mask = mask.mul_(1.0 / ((1.0 - dropout) * survival))
    if dropout > 0.0:
        mask = branch.new_empty(branch.shape).bernoulli_(1.0 - dropout).mul_(mask)
    return torch.addcmul(x, branch, mask)


def init_linear(linear: nn.Linear) -> nn.Linear:
    """Xavier-uniform weight, zero bias (the initialisation of every nn.Linear of the models)."""
    nn.init.xavier_uniform_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear


class Highway(nn.Module):
    """Highway network (Srivastava et al. 2015) on [..., dim] data.

    Layer i: [h; g] = layers[i](x) (transform and gate in one GEMM, ``nn.Linear(dim, 2 * dim)``),
    x <- x + sigmoid(g) * (dropout(relu(h)) - x), i.e. g*h + (1-g)*x.
    """

    def __init__(self, dim: int, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        self.layers = nn.ModuleList(init_linear(nn.Linear(dim, 2 * dim)) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim]."""
        for layer in self.layers:
            h, g = layer(x).chunk(2, dim=-1)
            h = F.dropout(F.relu(h), self.dropout, self.training)
            x = torch.addcmul(x, torch.sigmoid(g), h - x)
        return x
