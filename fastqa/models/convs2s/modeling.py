"""ConvS2S (Gehring et al. 2017, as in fairseq's fconv) on fastqa's GLU convolutions.

Top-down::

    ConvS2S(src [B, S], tgt_in [B, T]) -> (logits [B, T, V], attention [B, T, S])
      encoder: token + learned position embeddings e -> fc1 -> L x centred GLU conv block (padding zeroed
               through the op's mask, residual, x sqrt(1/2)) -> fc2 -> keys z (padding zeroed, gradient
               scaled by 1/(2 * decoder layers)); values (z + e) * sqrt(1/2). A batch more than 1/8
               padding runs fc1, the convolutions and fc2 on its real tokens packed into one row.
      decoder: token + position embeddings e -> fc1 -> L x [causal GLU conv (zeros on the left) ->
               attention (d = (W g + b + e) * sqrt(1/2), softmax over the real source tokens of d z^T,
               times (z + e), x sqrt(s) for s real source tokens; ``layers.DecodeAttention`` --,
               out-projection, + g, x sqrt(1/2)) -> + block input, x sqrt(1/2)] -> fc2 -> fc3
    Weight normalisation on every linear map and convolution, fairseq's initialisation (N(0, 0.1)
    embeddings; N(0, sqrt(c (1 - p) / fan_in)) weights, c = 4 for GLU convolutions; zero biases).

``layers="fast"`` builds the convolutions, linear maps and attention from ``fastqa.layers`` (fused
kernels), ``"reference"`` from ``fastqa.reference`` (pure PyTorch); both have the same parameter names,
so one state_dict loads into either. Incremental decoding (``decode_step``) advances every decoder
layer by one ``GLUConv1d.step`` per token on an explicit :class:`~.state.DecoderState`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrizations

import fastqa.layers
import fastqa.reference
from fastqa.reference.dropout_add import share_dropout_seeds

from ..._checks import arguments_checked
from ..checks import check_config
from ..device import reads_are_free
from ..packing import PackedBatch, should_pack
from .config import ConvS2SConfig
from .state import DecoderState, EncoderOut

__all__ = ["ConvS2S", "ConvS2SDecoder", "ConvS2SEncoder", "EncoderOut"]

SQRT_HALF = math.sqrt(0.5)
_GLU_CONV = {"fast": fastqa.layers.GLUConv1d, "reference": fastqa.reference.GLUConv1d}
_LINEAR = {"fast": fastqa.layers.Linear, "reference": fastqa.reference.Linear}
_ATTEND = {"fast": fastqa.layers.DecodeAttention, "reference": fastqa.reference.DecodeAttention}
# Both draw a seed per call and hash it into the mask, so the two layer kinds drop the same units; the fused
# layer does it in one pass, far faster than nn.Dropout's bernoulli; the reference in torch integer ops (an
# eager baseline on a par with nn.Dropout).
_DROPOUT = {"fast": fastqa.layers.DropoutAdd, "reference": fastqa.reference.DropoutAdd}


# --- building blocks: initialisation in one place ---------------------------------------------------------

def _embedding(num: int, dim: int, padding_idx: int | None = None) -> nn.Embedding:
    m = nn.Embedding(num, dim, padding_idx=padding_idx)
    nn.init.normal_(m.weight, 0.0, 0.1)
    if padding_idx is not None:
        with torch.no_grad():
            m.weight[padding_idx].zero_()
    return m


def _linear(layers: str, in_features: int, out_features: int, dropout: float = 0.0) -> nn.Linear:
    """Weight-normalised linear map; N(0, sqrt((1 - dropout) / in)) keeps the variance through dropout.
    The fast layers' nn.Linear runs each product on the GEMM engine measured fastest for its shape."""
    m = _LINEAR[layers](in_features, out_features)
    nn.init.normal_(m.weight, 0.0, math.sqrt((1.0 - dropout) / in_features))
    nn.init.zeros_(m.bias)
    return parametrizations.weight_norm(m, dim=0)


def _glu_conv(layers: str, channels: int, kernel_size: int, dropout: float, *, causal: bool) -> nn.Module:
    """GLU conv block; weight-normalised per output channel, N(0, sqrt(4 (1 - dropout) / (K H))) (the 4
    makes up for the GLU halving the variance twice). The encoder's block scales by sqrt(1/2) without
    the residual, which the encoder adds itself (the residual is the block input before dropout); the
    decoder's is a bare GLU (residual=False, scale=1): its attention sits between GLU and residual."""
    scale = 1.0 if causal else SQRT_HALF
    m = _GLU_CONV[layers](channels, kernel_size, causal=causal, residual=False, scale=scale)
    nn.init.normal_(m.conv.weight, 0.0, math.sqrt(4.0 * (1.0 - dropout) / (kernel_size * channels)))
    nn.init.zeros_(m.conv.bias)
    parametrizations.weight_norm(m.conv, dim=0)
    return m


class _GradMultiply(torch.autograd.Function):
    """Identity forward; gradient times ``scale`` backward (the encoder gets gradient from every
    decoder layer's attention, so fairseq scales it by 1 / (2 * attention layers))."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def _dense(y: torch.Tensor) -> torch.Tensor:
    """[B, T, H] in row-major memory. The reference block returns a channels-first view, and the residual
    add after it would keep that layout, so that every later op (the dropout's mask is hashed from
    logical indices and does not care) reads strided memory on one layer kind and not on the other. (The
    copy is nearly free: the next linear map would make it anyway.)"""
    return y.contiguous()


def _check_tokens(name: str, ids: object, vocab_size: int, max_positions: int) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype != torch.long or ids.dim() != 2:
        raise ValueError(f"{name} must be a [batch, length] int64 tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(ids.shape)}")
    if ids.shape[1] > max_positions:
        raise ValueError(f"{name} has length {ids.shape[1]} > max_positions {max_positions}")
    if not reads_are_free(ids.device):
        # Reading the ids' range would stall the host once per call: the device checks it (a failure stops
        # the CUDA context with this message, as an out-of-range embedding lookup would, but names the input).
        torch._assert_async(((ids >= 0) & (ids < vocab_size)).all(),
                            f"{name} holds a token id outside the vocabulary [0, {vocab_size})")
        return ids
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        where = tuple(int(i) for i in (ids == bad).nonzero()[0])
        raise ValueError(f"{name} holds token id {bad} at {where}, outside the vocabulary [0, {vocab_size})")
    return ids


# --- encoder ---------------------------------------------------------------------------------------------------

class ConvS2SEncoder(nn.Module):
    def __init__(self, cfg: ConvS2SConfig, layers: str) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        self.embed_tokens = _embedding(cfg.src_vocab_size, cfg.embed_dim, cfg.pad_id)
        self.embed_positions = _embedding(cfg.max_positions, cfg.embed_dim)
        self.fc1 = _linear(layers, cfg.embed_dim, cfg.hidden_dim, cfg.dropout)
        self.convs = nn.ModuleList(_glu_conv(layers, cfg.hidden_dim, cfg.kernel_size, cfg.dropout, causal=False)
                                   for _ in range(cfg.encoder_layers))
        self.fc2 = _linear(layers, cfg.hidden_dim, cfg.embed_dim)
        self.dropout = _DROPOUT[layers](cfg.dropout)
        self.grad_scale = 1.0 / (2.0 * cfg.decoder_layers)

    def forward(self, src: torch.Tensor) -> EncoderOut:
        """src: [B, S] int64, padded with pad_id on either side -> EncoderOut."""
        mask = src.ne(self.pad_id)                                   # [B, S]
        # Positions count real tokens, so left padding gives the same positions as right padding.
        positions = (mask.cumsum(1) - 1).clamp_(min=0)
        e = self.dropout(self.embed_tokens(src) + self.embed_positions(positions))   # [B, S, E]
        if not should_pack(mask):
            z = self.fc2(self._convolve(self.fc1(e), mask)).masked_fill(~mask.unsqueeze(-1), 0.0)   # [B, S, E]
        else:
            # Much padding (sentences of different lengths to decode together): the convolutions run on the
            # real tokens only -- all sentences in one row, (K-1)/2 masked rows between neighbours (the
            # zeros each centred window reads past its sentence's ends) -- and every real position sees
            # what it would see padded (a measurable share of greedy decoding on sentences of mixed lengths).
            packed = PackedBatch.of(mask, (self.convs[0].kernel_size - 1) // 2 if len(self.convs) else 0)
            x = self._convolve(self.fc1(packed.pack(e)), packed.mask)   # [1, P, H]
            z = packed.unpack(self.fc2(x), mask.shape)                   # [B, S, E], zeros at the padding
        z = _GradMultiply.apply(z, self.grad_scale)
        lengths = mask.sum(1, dtype=z.dtype)                         # [B]
        values = (z + e) * (SQRT_HALF * lengths.sqrt()).view(-1, 1, 1)
        return EncoderOut(keys=z, values=values, mask=mask)

    def _convolve(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The GLU conv stack: x [B, T, H], mask [B, T] -> [B, T, H]."""
        for conv in self.convs:
            # conv(...) = GLU(conv(dropout(x) with padding zeroed)) * sqrt(1/2); the residual is x itself.
            x = torch.add(_dense(conv(self.dropout(x), mask)), x, alpha=SQRT_HALF)
        return x


# --- decoder ---------------------------------------------------------------------------------------------------

class _Attention(nn.Module):
    """One decoder layer's attention over the encoder output."""

    def __init__(self, layers: str, hidden_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.in_proj = _linear(layers, hidden_dim, embed_dim)
        self.out_proj = _linear(layers, embed_dim, hidden_dim)
        self.attend = _ATTEND[layers]()   # softmax over the real source tokens, then the weighted values

    def forward(self, g: torch.Tensor, e: torch.Tensor, enc: EncoderOut) -> tuple[torch.Tensor, torch.Tensor]:
        """g: [N, T, H] GLU output; e: [N, T, E] target embeddings; N = B * r rows, r per sentence
        (beams), grouped by sentence. Returns ((out_proj(c) + g) sqrt(1/2) [N, T, H], weights [N, T, S])."""
        n, t, _ = g.shape
        b, s, emb = enc.keys.shape
        d = (self.in_proj(g) + e).reshape(b, (n // b) * t, emb)      # the r rows of a sentence share its keys
        c, weights = self.attend(d, enc.keys, enc.values, mask=enc.mask, scale=SQRT_HALF)   # values carry sqrt(s)
        out = torch.add(self.out_proj(c.reshape(n, t, emb)), g).mul_(SQRT_HALF)
        return out, weights.reshape(n, t, s)


class ConvS2SDecoder(nn.Module):
    def __init__(self, cfg: ConvS2SConfig, layers: str) -> None:
        super().__init__()
        self.embed_tokens = _embedding(cfg.tgt_vocab_size, cfg.embed_dim, cfg.pad_id)
        self.embed_positions = _embedding(cfg.max_positions, cfg.embed_dim)
        self.fc1 = _linear(layers, cfg.embed_dim, cfg.hidden_dim, cfg.dropout)
        self.convs = nn.ModuleList(_glu_conv(layers, cfg.hidden_dim, cfg.kernel_size, cfg.dropout, causal=True)
                                   for _ in range(cfg.decoder_layers))
        self.attentions = nn.ModuleList(_Attention(layers, cfg.hidden_dim, cfg.embed_dim) for _ in range(cfg.decoder_layers))
        self.fc2 = _linear(layers, cfg.hidden_dim, cfg.embed_dim)
        self.fc3 = _linear(layers, cfg.embed_dim, cfg.tgt_vocab_size, cfg.dropout)
        self.dropout = _DROPOUT[layers](cfg.dropout)

    def _output(self, x: torch.Tensor, argmax_exclude: Sequence[int] | None = None) -> torch.Tensor:
        """x: [..., H] -> logits [..., V], or with argmax_exclude their argmax [...] (never one of those ids)."""
        features = self.dropout(self.fc2(x))
        return self.fc3(features) if argmax_exclude is None else self.fc3.argmax(features, argmax_exclude)

    def forward(self, tgt_in: torch.Tensor, enc: EncoderOut, *, last_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """tgt_in: [N, T] int64 starting with sos (N = B * r, r rows per source sentence, grouped).
        Returns (logits [N, T, V], attention averaged over layers [N, T, S]); with last_only the last
        position's only ([N, 1, V], [N, 1, S]), for full-recompute decoding."""
        t = tgt_in.shape[1]
        e = self.dropout(self.embed_tokens(tgt_in) + self.embed_positions.weight[:t])   # [N, T, E]
        x = self.fc1(e)                                                                 # [N, T, H]
        attn = None
        for i, (conv, attention) in enumerate(zip(self.convs, self.attentions)):
            g = _dense(conv(self.dropout(x)))         # causal: K-1 zeros on the left, never the pad id
            if last_only and i == len(self.convs) - 1:
                # Only the last position is wanted from here on (its conv already saw the whole prefix).
                g, e, x = g[:, -1:], e[:, -1:], x[:, -1:]
                attn = None if attn is None else attn[:, -1:]
            a, w = attention(g, e, enc)
            attn = w if attn is None else attn + w
            x = torch.add(a, x).mul_(SQRT_HALF)
        return self._output(x), attn / len(self.convs)

    def attention_memory(self, enc: EncoderOut) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per layer, its attention's linear maps folded into the encoder output, for incremental decoding.

        scores = sqrt(1/2) (W_in g + b_in + e) . z = g . (sqrt(1/2) W_in^T z) + sqrt(1/2) (b_in . z + e . z), and
        out_proj(weights @ values) = weights @ (values W_out^T) + b_out: computed once per batch, they turn
        the two [E x H] projections of every row at every step into products with the S source positions.
        Returns (keys [B, S, H], score bias [B, 1, S], values [B, S, H]) per layer (the padding is the
        attention's mask, enc.mask).
        """
        memory = []
        for attention in self.attentions:
            keys = torch.matmul(enc.keys, attention.in_proj.weight).mul_(SQRT_HALF)
            bias = torch.matmul(enc.keys, attention.in_proj.bias).mul_(SQRT_HALF).unsqueeze(1)
            values = torch.matmul(enc.values, attention.out_proj.weight.t())
            memory.append((keys, bias, values))
        return memory

    def step(self, tokens: torch.Tensor, state: DecoderState, argmax_exclude: Sequence[int] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, DecoderState]:
        """One incremental step: tokens [N] (the newest token of each row, at position state.step).
        Returns (logits [N, V] -- with argmax_exclude, the argmax of each row's logits [N] int64, never one
        of those ids --, attention [N, S], the advanced state)."""
        enc, pos = state.encoder, state.step
        b, s, emb = enc.keys.shape
        n = tokens.shape[0]
        e = self.embed_tokens(tokens) + self.embed_positions.weight[pos]   # [N, E]: only the newest token
        x = self.fc1(e)                                                      # [N, H]
        if state.memory:  # the target-embedding part of the scores, shared by every layer: sqrt(1/2) e . z
            ez = torch.bmm(e.view(b, n // b, emb), enc.keys.transpose(1, 2)).mul_(SQRT_HALF)   # [B, r, S]
        attn = None
        new_states = []
        for i, (conv, attention, conv_state) in enumerate(zip(self.convs, self.attentions, state.conv_states)):
            g, conv_state = conv.step(x, conv_state)                        # [N, H], rolling [N, K-1, H]
            new_states.append(conv_state)
            if state.memory:
                keys, bias, values = state.memory[i]
                g3 = g.view(b, n // b, -1)
                c, w = attention.attend(g3, keys, values, ez + bias, enc.mask)         # [B, r, H], [B, r, S]
                a = c.add_(attention.out_proj.bias).add_(g3).mul_(SQRT_HALF).view(n, -1)
            else:
                a, w = attention(g.unsqueeze(1), e.unsqueeze(1), enc)
                a = a.squeeze(1)
            attn = w if attn is None else attn + w
            x = torch.add(a, x).mul_(SQRT_HALF)
        new_state = dataclasses.replace(state, conv_states=new_states, step=pos + 1)
        return self._output(x, argmax_exclude), attn.view(n, s) / len(self.convs), new_state


# --- the model -------------------------------------------------------------------------------------------------

class ConvS2S(nn.Module):
    """Convolutional sequence-to-sequence model. ``layers`` ("fast" | "reference") overrides
    ``config.layers``; the parameter names do not depend on it."""

    def __init__(self, config: ConvS2SConfig, layers: str | None = None) -> None:
        super().__init__()
        layers = check_config("ConvS2S", config, ConvS2SConfig, layers, tuple(_GLU_CONV))
        self.config = config
        self.layers = layers
        self.encoder = ConvS2SEncoder(config, layers)
        self.decoder = ConvS2SDecoder(config, layers)
        # A training forward draws its dropout seeds at once (one draw on the device, not one per call): the
        # embeddings' and each conv input's in the encoder and the decoder, and the decoder's output features.
        self.dropout_seeds = share_dropout_seeds(self, config.encoder_layers + config.decoder_layers + 3)

    def encode(self, src: torch.Tensor) -> EncoderOut:
        """src: [B, S] int64 (padded with pad_id) -> EncoderOut."""
        cfg = self.config
        src = _check_tokens("src", src, cfg.src_vocab_size, cfg.max_positions)
        with arguments_checked():   # the ops below take what the encoder builds from the checked ids
            return self.encoder(src)

    def decode(self, tgt_in: torch.Tensor, enc: EncoderOut, *, last_only: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing over tgt_in [N, T] (N a multiple of the encoded batch, rows grouped by
        sentence) -> (logits [N, T, V], attention [N, T, S]); see ConvS2SDecoder.forward. The ops check what
        they take from ``enc`` (the caller's; ``forward`` skips those checks, its ``enc`` being ``encode``'s)."""
        cfg = self.config
        _check_tokens("tgt_in", tgt_in, cfg.tgt_vocab_size, cfg.max_positions)
        if tgt_in.shape[0] % enc.keys.shape[0]:
            raise ValueError(f"tgt_in has {tgt_in.shape[0]} rows, not a multiple of the {enc.keys.shape[0]} "
                             f"encoded sentences")
        return self.decoder(tgt_in, enc, last_only=last_only)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src: [B, S], tgt_in: [B, T] (starts with sos) -> (logits [B, T, V_tgt], attention [B, T, S])."""
        if isinstance(src, torch.Tensor) and isinstance(tgt_in, torch.Tensor) and src.shape[:1] != tgt_in.shape[:1]:
            raise ValueError(f"src and tgt_in must have the same batch size, got {src.shape[0]} and {tgt_in.shape[0]}")
        seeds = self.dropout_seeds if self.training and isinstance(src, torch.Tensor) else None
        if seeds is not None:
            seeds.draw(src.device)
        with arguments_checked():   # encode and decode check the ids; the ops take what is built from them
            out = self.decode(tgt_in, self.encode(src))
        if seeds is not None:
            seeds.release()
        return out

    def initial_state(self, enc: EncoderOut, rows_per_sentence: int = 1, *, incremental: bool = True,
                      fold_attention: bool | None = None) -> DecoderState:
        """Decoder state before the first token (sos at position 0): zero conv states
        [B * rows_per_sentence, K-1, H] per layer (none for full-recompute decoding).

        fold_attention: precompute the attention memory (``ConvS2SDecoder.attention_memory``). It costs
        two [E x H] products per source position and saves two per row and step, so it pays when a
        sentence's rows times its steps exceed its source length: by default with beams (rows > 1), not
        for greedy decoding.
        """
        if not incremental:
            return DecoderState(encoder=enc, conv_states=[], step=0, rows_per_sentence=rows_per_sentence)
        n = enc.keys.shape[0] * rows_per_sentence
        states = [conv.initial_state(n, device=enc.keys.device, dtype=enc.keys.dtype) for conv in self.decoder.convs]
        fold = rows_per_sentence > 1 if fold_attention is None else fold_attention
        return DecoderState(encoder=enc, conv_states=states, step=0, rows_per_sentence=rows_per_sentence,
                            memory=self.decoder.attention_memory(enc) if fold else [])

    def decode_step(self, tokens: torch.Tensor, state: DecoderState, *, argmax_exclude: Sequence[int] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, DecoderState]:
        """Incremental decoding: tokens [N] at position state.step -> (logits [N, V], attention [N, S],
        new state). The state is not modified in place. With ``argmax_exclude`` (token ids never to pick)
        the first result is the greedy choice instead, [N] int64: the output layer's ``argmax`` (on the
        fast layers a kernel that scans the logits as the GEMM leaves them, instead of torch.argmax)."""
        if state.step >= self.config.max_positions:
            raise ValueError(f"decoding position {state.step} is past max_positions {self.config.max_positions}")
        return self.decoder.step(tokens, state, argmax_exclude)
