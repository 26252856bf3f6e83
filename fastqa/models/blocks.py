"""Building blocks the models share: frozen word vectors, the sinusoidal timing signal, a highway network,
masked log-softmax and the initialisation of linear layers (plain ``torch.nn``)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .device import buffer_in
from .regularization import TorchDropoutAdd

__all__ = ["FrozenWordVectors", "Highway", "TimingSignal", "init_linear", "masked_log_softmax", "timing_signal"]


class FrozenWordVectors(nn.Module):
    """Frozen word vectors with a trainable <unk> vector, for a model that subclasses this.

    Parameters ``word_vectors`` [V, dim] (requires_grad False: pre-trained vectors stay as they are, and
    DDP broadcasts them once instead of reducing them every step; the <pad> row is zero, the <unk> row unused)
    and ``unk_vector`` [dim] (trainable: the vector of every word without a pre-trained one).
    """

    def _make_word_vectors(self, vocab_size: int, dim: int, *, pad_id: int, unk_id: int) -> None:
        self._pad_id, self._unk_id = pad_id, unk_id
        self.word_vectors = nn.Parameter(torch.empty(vocab_size, dim), requires_grad=False)
        self.unk_vector = nn.Parameter(torch.empty(dim))

    @torch.no_grad()
    def _init_word_vectors(self) -> None:
        """Random word vectors (until ``load_word_vectors``) with a zero <pad> row; a small random <unk>."""
        std = self.word_vectors.shape[1] ** -0.5
        nn.init.normal_(self.word_vectors, std=std)
        self.word_vectors[self._pad_id].zero_()
        self.word_vectors[self._unk_id].zero_()
        nn.init.normal_(self.unk_vector, std=std)

    @torch.no_grad()
    def load_word_vectors(self, vectors: torch.Tensor) -> None:
        """Copy ``vectors`` [word_vocab_size, word_dim] into the frozen table; the <pad> row stays zero and
        the <unk> row is unused (the trainable ``unk_vector`` stands for <unk>)."""
        if not isinstance(vectors, torch.Tensor) or not vectors.is_floating_point():
            raise TypeError(f"load_word_vectors: vectors must be a floating-point tensor, got "
                            f"{type(vectors).__name__ if not isinstance(vectors, torch.Tensor) else vectors.dtype}")
        expected = tuple(self.word_vectors.shape)
        if tuple(vectors.shape) != expected:
            raise ValueError(f"load_word_vectors: vectors must have shape {expected} "
                             f"[word_vocab_size, word_dim], got {tuple(vectors.shape)}")
        self.word_vectors.copy_(vectors)
        self.word_vectors[self._pad_id].zero_()
        self.word_vectors[self._unk_id].zero_()

    def embed_words(self, words: torch.Tensor) -> torch.Tensor:
        """words: [...] ids -> [..., dim] (<unk> reads ``unk_vector``)."""
        w = F.embedding(words, self.word_vectors)
        return torch.where((words == self._unk_id).unsqueeze(-1), self.unk_vector.to(w.dtype), w)


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


class TimingSignal(nn.Module):
    """``timing_signal`` of ``channels`` channels as a device buffer built once (non-persistent: no state_dict
    entry) and sliced per call, not rebuilt per forward: ``signal(length, dtype)`` -> [length, channels]. A
    longer length than the buffer holds regrows it (a power of two); under ``torch.compile`` such a length is
    computed for the call instead. Values as ``timing_signal``'s (float32, rounded to the model's dtype once;
    cast once under autocast: ``buffer_in``)."""

    def __init__(self, channels: int, length: int = 512) -> None:
        super().__init__()
        self.channels = channels
        self.register_buffer("table", timing_signal(length, channels), persistent=False)

    def forward(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        if length > self.table.shape[0]:
            grown = timing_signal(1 << (length - 1).bit_length(), self.channels, device=self.table.device)
            if torch.compiler.is_compiling():
                return grown[:length].to(dtype)
            self.table = grown.to(self.table.dtype)
        return buffer_in(self, "table", dtype)[:length]


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax over the entries where ``mask`` (bool, True = real) holds.

    Masked entries get the dtype's most negative finite logit, so their log-probability is finite
    (never -inf or NaN, also when multiplied by 0) and its exp is exactly 0. logits, mask: same shape.
    """
    return F.log_softmax(logits.masked_fill(~mask, torch.finfo(logits.dtype).min), dim=dim)


def init_linear(linear: nn.Linear) -> nn.Linear:
    """Xavier-uniform weight, zero bias (the initialisation of every nn.Linear of the models)."""
    nn.init.xavier_uniform_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear


class _CarryGate(torch.autograd.Function):
    """x + sigmoid(g) * t (``addcmul``, its values exactly) with the gradients autograd's formulas give, bit for bit,
    but without their copies: addcmul's backward scales each factor by its multiplier (a scalar tensor and a
    product per factor) before the product with the gradient, and the sigmoid's gradient is a node of its own."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, g: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(g)
        ctx.save_for_backward(gate, t)
        return torch.addcmul(x, gate, t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, t = ctx.saved_tensors
        _, wants_g, wants_t = ctx.needs_input_grad
        grad_g = torch.ops.aten.sigmoid_backward(grad * t, gate) if wants_g else None
        return grad, grad_g, grad * gate if wants_t else None


class Highway(nn.Module):
    """Highway network (Srivastava et al. 2015) on [..., dim] data.

    Layer i: [h; g] = layers[i](x) (transform and gate in one GEMM, ``nn.Linear(dim, 2 * dim)``),
    x <- x + sigmoid(g) * (dropout(relu(h)) - x), i.e. g*h + (1-g)*x.
    """

    def __init__(self, dim: int, num_layers: int = 2, dropout: float = 0.0,
                 linear: type[nn.Linear] = nn.Linear, dropout_layer: type[nn.Module] = TorchDropoutAdd) -> None:
        super().__init__()
        self.dropout = dropout_layer(dropout)
        self.layers = nn.ModuleList(init_linear(linear(dim, 2 * dim)) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim]."""
        for layer in self.layers:
            h, g = layer(x).chunk(2, dim=-1)
            h = self.dropout(F.relu(h))
            x = _CarryGate.apply(x, g, h - x)
        return x

