"""The state ConvS2S decoding carries: the encoder output the decoder attends to, and the explicit
incremental decoder state (passed into ``ConvS2S.decode_step`` and returned, never kept in the model)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

__all__ = ["EncoderOut", "DecoderState"]


@dataclass
class EncoderOut:
    """What the decoder attends to, per source sentence (computed once per batch).

    keys: [B, S, E] (z, padding zeroed); values: [B, S, E] ((z + e) sqrt(1/2), times sqrt(s) with s the
    sentence's real source tokens, so the attention output needs no further scaling);
    mask: [B, S] bool (False = padding: the attention never reads it).
    """
    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor

    def index_select(self, sentences: torch.Tensor) -> "EncoderOut":
        """The sentences ``sentences`` ([B'] int64) only."""
        return EncoderOut(*(t.index_select(0, sentences) for t in (self.keys, self.values, self.mask)))


@dataclass
class DecoderState:
    """Everything incremental decoding carries from one step to the next; passed in and returned.

    encoder: the EncoderOut of B sentences; conv_states: per decoder layer the last K-1 inputs of its
    causal convolution, [N, K-1, H] with N = B * rows_per_sentence rows grouped by sentence; memory: per
    decoder layer, its attention's linear maps folded into the encoder output once per batch (keys
    [B, S, H], score bias [B, 1, S], values [B, S, H]; see ``ConvS2SDecoder.attention_memory``), shared
    by a sentence's rows; step: the position of the next token to feed (0 = sos). Full-recompute
    decoding keeps only the encoder output (conv_states and memory empty).
    """
    encoder: EncoderOut
    conv_states: list[torch.Tensor]
    step: int
    rows_per_sentence: int = 1
    memory: list[tuple[torch.Tensor, ...]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.encoder.keys.shape[0] * self.rows_per_sentence

    def reorder(self, order: torch.Tensor, *, check: bool = True) -> "DecoderState":
        """Row r of the new state is row order[r] of this one ([N] int64), for the surviving beams.
        Rows stay with their sentence (the sentence's encoder output and memory are shared, not copied).
        ``check=False`` skips the check that they do, which reads ``order`` on the host: for callers whose
        orders stay within sentences by construction (beam search, at every step)."""
        n, r = self.rows, self.rows_per_sentence
        if order.dtype != torch.long or order.shape != (n,):
            raise ValueError(f"order must be a [{n}] int64 tensor, got {order.dtype} of shape {tuple(order.shape)}")
        if check and r > 1 and not torch.equal(order.div(r, rounding_mode="floor"),
                                     torch.arange(n, device=order.device).div(r, rounding_mode="floor")):
            raise ValueError(f"order must keep every row among its sentence's {r} rows")
        return dataclasses.replace(self, conv_states=[s.index_select(0, order) for s in self.conv_states])

    def select(self, sentences: torch.Tensor) -> "DecoderState":
        """Only the sentences ``sentences`` ([B'] int64, indices into this state's sentences) and their rows."""
        r = self.rows_per_sentence
        rows = (sentences.unsqueeze(1) * r + torch.arange(r, device=sentences.device)).reshape(-1)
        return dataclasses.replace(
            self, encoder=self.encoder.index_select(sentences),
            conv_states=[s.index_select(0, rows) for s in self.conv_states],
            memory=[tuple(t.index_select(0, sentences) for t in layer) for layer in self.memory])
