"""QANet (Yu et al. 2018) on fastqa's layers, top-down.

QANet(config, layers="fast" | "reference" | "naive"):

    words, chars ─► embedding: [frozen word vector (trainable <unk>); char CNN per word + max
                                 (; with word_match, 1 where the word occurs in the other text)]
                 ─► depthwise-separable resize to d ─► 2-layer highway
                 ─► embedding-encoder block (shared by context and question)
    context, question ─► context-query attention [c, a, c∘a, c∘b] ─► 1x1 resize 4d -> d
                 ─► model encoder (blocks applied 3 times with shared weights): M0, M1, M2
                 ─► start = log_softmax(w_s·[M0; M1]), end = log_softmax(w_e·[M0; M2])

Every encoder block: timing signal, then pre-LayerNorm sublayers (convolutions, self-attention, feed-forward),
each ``x + dropout(sublayer(LN(x)))`` with stochastic depth in training. Padding never reaches a real
position: the convolutions read padded rows as zeros (their ``mask``), attention masks padded keys, and
the embedding of a padding token is exactly zero, so an answer does not depend on the batch it is in. With the
fused layers, a batch with much padding runs its context path (resize conv, highway, embedding and model
encoders) on the real words only, packed into one row (``PackedBatch``): the same values, a quarter less work at
a quarter of padding (on the CPU: on a GPU the batch stays padded, so a step never waits on the device).
``layers`` picks the modules of the
convolution sublayers, the self-attention sublayers, the embedding resizer, the context-query attention and
the linear maps (fast: ``fastqa.layers.Linear``, each product on the GEMM engine measured fastest for its
shape); the rest is ``torch.nn`` and the same for all three, so one state_dict loads into each.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ... import layers as fused
from ... import reference
from ..._checks import arguments_checked
from ...reference.dropout_add import share_dropout_seeds
from ..blocks import FrozenWordVectors, Highway, TimingSignal, init_linear
from ..checks import check_config, check_qa_inputs
from ..device import reads_are_free
from ..packing import PackedBatch, should_pack
from ..regularization import StochasticDepth, TorchDropoutAdd, survival_prob
from .config import LAYERS, QANetConfig

__all__ = ["LAYER_SETS", "CharEmbedding", "EncoderBlock", "FeedForward", "NaiveContextQueryAttention", "QANet"]


class NaiveContextQueryAttention(reference.ContextQueryAttention):
    """The tutorials' context-query attention (similarity through a [B, n, m, 3d] concatenation): a benchmark
    baseline with the parameters of ``reference.ContextQueryAttention``."""

    def forward(self, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor) -> torch.Tensor:
        """c: [B, n, d]; q: [B, m, d]; masks [B, n], [B, m] bool -> [B, n, 4d]."""
        return reference.context_query_attention_naive(c, q, c_mask, q_mask, self.weight, self.bias)


@dataclass(frozen=True)
class _LayerSet:
    ln_conv: type[nn.Module]  # LN + depthwise-separable conv (+ ReLU + residual): the conv sublayer
    conv: type[nn.Module]     # depthwise-separable conv: the embedding resizer
    cqa: type[nn.Module]      # context-query attention
    attention: type[nn.Module]  # pre-LN multi-head self-attention sublayer branch
    linear: type[nn.Linear]   # every linear map (feed-forward, highway, context-query resizer, heads)
    dropout: type[nn.Module]  # every dropout, and a sublayer's residual add with its stochastic depth


LAYER_SETS: dict[str, _LayerSet] = {
    "fast": _LayerSet(fused.LayerNormDepthwiseSeparableConv1d, fused.DepthwiseSeparableConv1d,
                      fused.ContextQueryAttention, fused.SelfAttention, fused.Linear, fused.DropoutAdd),
    "reference": _LayerSet(reference.LayerNormDepthwiseSeparableConv1d, reference.DepthwiseSeparableConv1d,
                           reference.ContextQueryAttention, reference.SelfAttention, reference.Linear, TorchDropoutAdd),
    "naive": _LayerSet(reference.LayerNormDepthwiseSeparableConv1d, reference.DepthwiseSeparableConv1d,
                       NaiveContextQueryAttention, reference.SelfAttention, reference.Linear, TorchDropoutAdd),
}


class CharEmbedding(nn.Module):
    """Character embedding of each word: a conv over the characters of that word alone, ReLU, max over the
    word's characters, dropout.

    Parameters: ``embed`` (nn.Embedding, pad row zero) and ``conv`` (nn.Conv1d(dim, channels, K), 'same'
    zero padding). Computed without the conv's GEMM: embedding then conv is linear in the one-hot
    characters, so table[k, c] = embed(c) @ conv.weight[:, :, k].T ([K * V, channels], V x dim x K x
    channels multiply-adds) is built once per call and the conv at character t is the sum over k of
    table[k, char[t + k - K//2]] -- ``F.embedding_bag`` (sum) over [B*n*W] bags of K rows, a chunk of words
    at a time. That replaces 2 * B*n*W * dim * K * channels FLOPs (92 GFLOP forward for the paper model at
    batch 32) by a gather. Windows never leave the word (each word's ids are padded on its own), padding
    characters have zero rows, like the conv's zero padding, and are left out of the max, so a word's
    vector depends neither on its neighbours nor on how far the batch pads W. The dropout is on the
    character vector of the word (after the max), which the table needs: dropping embedding entries per
    character occurrence would make every occurrence a different row.
    """

    # Values of the conv output per chunk of words (see forward).
    _CHUNK_VALUES = 1 << 21

    def __init__(self, vocab_size: int, dim: int, channels: int, kernel_size: int, *, pad_id: int,
                 dropout: float, dropout_layer: type[nn.Module] = TorchDropoutAdd) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.dropout = dropout_layer(dropout)
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.conv = nn.Conv1d(dim, channels, kernel_size, padding=kernel_size // 2)

    def table(self) -> torch.Tensor:
        """The conv's taps of every character: [K * V + 1, channels] (see the class docstring; the last row is
        the padding characters' centre tap). It depends on the parameters alone, so a forward that embeds two
        texts builds it once and passes it to both calls."""
        vocab, k = self.embed.num_embeddings, self.conv.kernel_size[0]
        emb = self.embed.weight
        # Zero padding row, exactly (the index made on the device: a host list would be a blocking copy).
        emb = emb.index_fill(0, torch.full((1,), self.pad_id, dtype=torch.long, device=emb.device), 0.0)
        # In the parameters' dtype, autocast or not: a bf16 table would round every tap before the gather sums
        # them, and its backward would scatter-add bf16 rows (slower than float32's on a CPU).
        with torch.autocast(emb.device.type, enabled=False):
            table = torch.einsum("vd,cdk->kvc", emb, self.conv.weight).reshape(k * vocab, -1)  # [K*V, C]
        # Row K*V: far below any real conv value. A padding character's bag reads it in place of its
        # centre tap, so the max below never picks a padding character -- without a masked pass over the
        # [B*n, W, C] conv output (that pass and its backward were a fifth of the paper model's train step).
        return torch.cat([table, table.new_full((1, table.shape[1]), torch.finfo(table.dtype).min / 4)])

    def forward(self, chars: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """chars: [B, n, W] char ids -> [B, n, channels] (zeros for all-padding words). table: ``table()``
        when the caller built it already (None: built here)."""
        b, n, w = chars.shape
        vocab, k = self.embed.num_embeddings, self.conv.kernel_size[0]
        if table is None:
            table = self.table()
        # Only the words that have characters, up to the last column that holds one: padding words and
        # padding columns are most of a batch (words of ~5 characters in 16 slots, contexts of different
        # lengths), and dropping them changes nothing -- a window past the last column reads padding,
        # which is what F.pad adds, and an all-padding word's vector is 0 (below).
        # On a GPU every word and column stays: finding them needs their count on the host (a stall per step),
        # and the padding's share of the gather costs less there than the stall.
        flat = chars.reshape(b * n, w)
        words = None
        if reads_are_free(flat.device):
            real = flat != self.pad_id
            words = real.any(1).nonzero().squeeze(1)                               # [R]
            width = int(real.any(0).nonzero().max()) + 1 if words.numel() else 1
            flat = flat[words, :width]                                             # [R, W']
        else:
            width = w
        ids = F.pad(flat, (k // 2, k // 2), value=self.pad_id)                     # [R, W' + K - 1]
        bags = ids.unfold(1, k, 1) + torch.arange(0, k * vocab, vocab, device=ids.device)  # [R, W', K]
        bags[..., k // 2].masked_fill_(flat == self.pad_id, k * vocab)
        # h is the conv without its bias: max over the real characters, then bias and ReLU (both monotone:
        # relu(max + b) = max relu(. + b)). max, not amax: amax's backward casts a [R, W', C] equality mask to
        # float twice (~0.85 s of the paper model's step at batch 32); max's scatters the gradient through the
        # argmax indices. In chunks of words: each chunk's [words, W', C] sums (forward) and their gradient
        # (backward, zero-filled) stay a few MB and reuse one buffer, where the whole batch's were 77 MB
        # (the paper model at batch 32), allocated afresh and page-faulted in on every step.
        # On a GPU: one chunk (memory is plentiful there, and each chunk is a few more launches). An all-padding
        # word kept there reads the K*V row at every centre tap, so its max is far below zero: relu gives 0.
        channels = table.shape[1]
        step = len(bags) if words is None else max(1, self._CHUNK_VALUES // (width * channels))
        maxima = [F.embedding_bag(chunk.reshape(-1, k), table, mode="sum").view(len(chunk), width, channels)
                  .max(dim=1).values for chunk in bags.split(max(step, 1))]
        # In place where the tensor is this function's own (no copy of one chunk, ReLU on the sum's output).
        vectors = F.relu((maxima[0] if len(maxima) == 1 else torch.cat(maxima)) + self.conv.bias,
                         inplace=True)                                              # [R, C]
        if words is None:
            return self.dropout(vectors).reshape(b, n, -1)
        out = vectors.new_zeros(b * n, vectors.shape[1]).index_copy_(0, words, vectors)  # padding words: 0
        return self.dropout(out).reshape(b, n, -1)


class FeedForward(nn.Module):
    """Pre-LN feed-forward sublayer branch: ff2(relu(ff1(LN(x))))."""

    def __init__(self, d_model: int, linear: type[nn.Linear] = nn.Linear) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.ff1 = init_linear(linear(d_model, d_model))
        self.ff2 = init_linear(linear(d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, L, d] -> [B, L, d]."""
        return self.ff2(F.relu(self.ff1(self.norm(x))))


class EncoderBlock(nn.Module):
    """QANet encoder block: + timing signal, conv sublayers, self-attention, feed-forward (all pre-LN).

    Parameters: ``convs`` (the layer set's LayerNormDepthwiseSeparableConv1d, ReLU), ``attention``,
    ``ffn``. Sublayer i of the block has the survival probability ``survival[i]`` (conv_layers + 2 of them;
    None: all 1), drawn through ``depth`` (``StochasticDepth``, its constants on the device).
    """

    def __init__(self, d_model: int, heads: int, conv_layers: int, kernel_size: int, dropout: float,
                 layer_set: _LayerSet, survival: list[float] | None = None) -> None:
        super().__init__()
        self.depth = StochasticDepth(survival or [1.0] * (conv_layers + 2))
        self.dropout = layer_set.dropout(dropout)
        self.convs = nn.ModuleList(layer_set.ln_conv(d_model, d_model, kernel_size, activation="relu")
                                   for _ in range(conv_layers))
        self.attention = layer_set.attention(d_model, heads)
        init_linear(self.attention.qkv)
        init_linear(self.attention.out)
        self.ffn = FeedForward(d_model, layer_set.linear)

    def forward(self, x: torch.Tensor, timing: torch.Tensor, mask: torch.Tensor,
                packed: PackedBatch | None = None, *, own_input: bool = False) -> torch.Tensor:
        """x: [B, L, d]; timing: [L, d]; mask: [B, L] bool (True = a real position: the keys to attend to,
        and the rows the convolutions read -- padded rows enter them as zeros, so the outputs at real
        positions do not depend on how far the batch pads).
        packed: x is a packed batch ([1, P, d], timing [P, d], mask [1, P]: ``PackedBatch``), whose sequences
        attend separately and drop sublayers per sequence.
        own_input: nothing reads x after this call, so the timing signal is added to it in place (no copy)."""
        batch = x.shape[0] if packed is None else len(packed.lengths)
        scales = self.depth(batch, x.dtype) if self.training else None
        if scales is not None and packed is not None:
            scales = packed.per_row(scales)                          # [S, P]: each row its sequence's factor
        # Nothing dropped (evaluation): the convolutions add their residual themselves.
        plain = scales is None and (not self.training or self.dropout.p == 0.0)
        x = x.add_(timing) if own_input else x + timing
        rows = packed is not None
        for i, conv in enumerate(self.convs):
            x = conv(x, residual=x, mask=mask) if plain else self._add(conv(x, mask=mask), x, scales, i, rows)
        n = len(self.convs)
        segments = None if packed is None else packed.segments()
        x = self._add(self.attention(x, mask, segments), x, scales, n, rows)
        return self._add(self.ffn(x), x, scales, n + 1, rows)

    def _add(self, branch: torch.Tensor, x: torch.Tensor, scales: torch.Tensor | None, i: int,
             rows: bool) -> torch.Tensor:
        """x + dropout(branch), sublayer i's branch dropped per example by stochastic depth in training
        (scales [S, B]; rows: x is a packed [1, P, d] and scales [S, P], one factor per row)."""
        if scales is None:
            return self.dropout(branch, x)
        if rows:  # one factor per row, so the rows are the dropout's batch dimension
            return self.dropout(branch.flatten(0, 1), x.flatten(0, 1), scales[i]).view_as(x)
        return self.dropout(branch, x, scales[i])


class QANet(FrozenWordVectors):
    """QANet reader (see the module docstring for the architecture).

    ``QANet(config, layers=None)``: layers "fast" (fastqa.layers: fused kernels), "reference"
    (fastqa.reference, pure PyTorch) or "naive" (reference + the [B, n, m, 3d] trilinear); None takes
    ``config.layers``. forward -> (log_p_start, log_p_end), each [B, n] (or [B, 1 + n] with
    ``config.no_answer``, index 0 = no answer). The word table ``word_vectors`` is a frozen parameter
    (fill it with ``load_word_vectors``); ``unk_vector`` is the trainable <unk> vector.
    """

    #: forward(..., logits=True) gives the span scores before their softmax (ranked across a document's windows)
    SPAN_LOGITS = True

    def __init__(self, config: QANetConfig, layers: str | None = None) -> None:
        super().__init__()
        layers = check_config("QANet", config, QANetConfig, layers, LAYERS)
        self.config = config
        self.layer_impl = layers
        ls = LAYER_SETS[layers]
        c, d = config, config.d_model

        self._make_word_vectors(c.word_vocab_size, c.word_dim, pad_id=c.pad_id, unk_id=c.unk_id)
        self.char_embedding = CharEmbedding(c.char_vocab_size, c.char_dim, c.char_channels, c.char_kernel,
                                            pad_id=c.pad_id, dropout=c.char_dropout, dropout_layer=ls.dropout)
        self.dropout = ls.dropout(c.dropout)  # on the word vectors and on the context-query resizer's output
        # [word; char] -> d first, then the highway at width d (as the authors' code: cheaper than at 500).
        self.emb_resize = ls.conv(c.word_dim + c.char_channels + int(c.word_match), d, c.emb_resize_kernel)
        self.highway = Highway(d, 2, c.dropout, linear=ls.linear, dropout_layer=ls.dropout)
        # Survival probabilities: l counts the sublayers of one stack (1..L), the same in each pass.
        n_emb = c.emb_conv_layers + 2                  # a block's convolutions, attention and feed-forward
        self._emb_survival = [survival_prob(i + 1, n_emb, c.layer_dropout) for i in range(n_emb)]
        per_block = c.model_conv_layers + 2
        total = per_block * c.model_blocks
        self._model_survival = [[survival_prob(b * per_block + i + 1, total, c.layer_dropout)
                                 for i in range(per_block)] for b in range(c.model_blocks)]
        self.emb_encoder = EncoderBlock(d, c.heads, c.emb_conv_layers, c.emb_conv_kernel, c.dropout, ls,
                                        self._emb_survival)
        self.cq_attention = ls.cqa(d)
        self.cq_resize = init_linear(ls.linear(4 * d, d))
        self.model_encoder = nn.ModuleList(
            EncoderBlock(d, c.heads, c.model_conv_layers, c.model_conv_kernel, c.dropout, ls, survival)
            for survival in self._model_survival)
        self.timing = TimingSignal(d)
        self.start_head = init_linear(ls.linear(2 * d, 1))
        self.end_head = init_linear(ls.linear(2 * d, 1))
        if c.no_answer:
            # The null score reads the max-pooled head inputs, so it can tell answerable from unanswerable.
            self.null_start = init_linear(ls.linear(2 * d, 1))
            self.null_end = init_linear(ls.linear(2 * d, 1))
        self._init_word_vectors()
        # The fused layers run the context path on the real context words only (PackedBatch) when padding
        # is more than an eighth of the batch; the pure-PyTorch sets compute the padding, as a PyTorch user's
        # model does. The same values at every real position either way.
        self.pack_padding = layers == "fast"
        # A training forward draws its dropout seeds at once (one draw on the device, not one per call).
        self.dropout_seeds = share_dropout_seeds(self, self.dropout_calls())

    def dropout_calls(self) -> int:
        """The dropout calls of one training forward: per text (context, question) the word vectors', the
        characters', the highway's layers' and the embedding block's sublayers'; the resized attention's; and
        three model passes over the blocks' sublayers."""
        c = self.config
        per_text = 2 + len(self.highway.layers) + c.emb_conv_layers + 2
        return 2 * per_text + 1 + 3 * c.model_blocks * (c.model_conv_layers + 2)

    def _embed(self, words: torch.Tensor, chars: torch.Tensor, other_words: torch.Tensor, char_table: torch.Tensor,
               packed: PackedBatch | None = None) -> torch.Tensor:
        """words: [B, L]; chars: [B, L, W]; other_words: [B, L'] (the other text); char_table: the character
        embedding's ``table()`` -> [B, L, d], or [1, P, d] on the packed rows (the resize conv and the highway
        skip the padding)."""
        w = self.dropout(self.embed_words(words))
        parts = [w, self.char_embedding(chars, char_table)]
        if self.config.word_match:
            parts.append(self._word_match(words, other_words).to(w.dtype))
        x = torch.cat(parts, dim=-1)
        if packed is not None:
            x = packed.pack(x)  # the gaps are zeros, as padded words' embeddings
        return self.highway(self.emb_resize(x))

    def _word_match(self, words: torch.Tensor, other_words: torch.Tensor) -> torch.Tensor:
        """words: [B, L], other_words: [B, L'] -> [B, L, 1] bool: the word (not <pad>/<unk>) occurs in
        other_words. Two different out-of-vocabulary words share <unk>, so <unk> never matches."""
        real = (words != self.config.pad_id) & (words != self.config.unk_id)
        found = (words.unsqueeze(2) == other_words.unsqueeze(1)).any(dim=2)     # [B, L, L'] -> [B, L]
        return (found & real).unsqueeze(-1)

    def _model_pass(self, x: torch.Tensor, timing: torch.Tensor, mask: torch.Tensor,
                    packed: PackedBatch | None = None, own_input: bool = False) -> torch.Tensor:
        """own_input: nothing reads x after the pass. A block's output is the next block's alone (M0 and M1, read
        again by the heads, are not; nor is the first pass's input in evaluation, the linear resizer's output:
        a view that its custom Function made, which autograd lets nobody change in place)."""
        for i, block in enumerate(self.model_encoder):
            x = block(x, timing, mask, packed, own_input=own_input or i > 0)
        return x

    def _context_packing(self, mask: torch.Tensor) -> PackedBatch | None:
        """The packing of the context's real words (mask [B, n]) for the fused layers when padding is over an
        eighth of the batch, else None. The context path (resize conv, highway, embedding encoder, model
        encoder) then skips the padding: a quarter of padding was a fifth of the fast model's train step (the
        convolutions, projections, LayerNorms and dropouts compute every row; attention alone skipped padded
        ones). Gaps as wide as the widest centred conv needs. Never on a GPU (``should_pack``: deciding and
        packing would stall the host on the device several times a step)."""
        if not self.pack_padding or not should_pack(mask, every_row_real=True):
            return None
        c = self.config
        return PackedBatch.of(mask, max(c.emb_resize_kernel, c.emb_conv_kernel, c.model_conv_kernel) // 2)

    def forward(self, context_words: torch.Tensor, context_chars: torch.Tensor, question_words: torch.Tensor,
                question_chars: torch.Tensor, *, logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """context_words: [B, n]; context_chars: [B, n, W]; question_words: [B, m]; question_chars: [B, m, W']
        (int64 ids, ``pad_id`` = padding). Returns (log_p_start, log_p_end): [B, n], or [B, 1 + n] with
        ``no_answer`` (index 0 = no answer). Padded positions have a finite log-prob whose exp is exactly 0.

        ``logits=True``: the scores before their softmax instead, padding at the dtype's lowest finite value.
        Unlike the log-probabilities they compare between contexts, so the windows of one long document are
        ranked by them (``fastqa.tasks.qa.inference``; a reader's ``SPAN_LOGITS`` says it offers them)."""
        cw, cc, qw, qc = check_qa_inputs("QANet", context_words, context_chars, question_words, question_chars)
        seeds = self.dropout_seeds if self.training else None
        if seeds is not None:
            seeds.draw(cw.device)
        with arguments_checked():   # the inputs are checked: the ops below take what the model builds from them
            out = self._forward(cw, cc, qw, qc, logits)
        if seeds is not None:
            seeds.release()
        return out

    def _forward(self, cw: torch.Tensor, cc: torch.Tensor, qw: torch.Tensor, qc: torch.Tensor,
                 logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """forward on checked inputs."""
        pad = self.config.pad_id
        c_mask, q_mask = cw != pad, qw != pad

        # packed: the context path runs on its real words, one row [1, P, d] (c_rows: its mask [1, P]).
        packed = self._context_packing(c_mask)
        char_table = self.char_embedding.table()   # shared by the two texts
        c, q = self._embed(cw, cc, qw, char_table, packed), self._embed(qw, qc, cw, char_table)
        d, n = c.shape[-1], cw.shape[1]
        timing = self.timing(max(n, q.shape[1]), c.dtype)
        c_timing, q_timing = timing[:n], timing[: q.shape[1]]
        c_rows = c_mask
        if packed is not None:
            c_timing, c_rows = packed.pack(c_timing.expand(*c_mask.shape, d))[0], packed.mask
        # The highway's outputs are read by the embedding encoder alone.
        c = self.emb_encoder(c, c_timing, c_rows, packed, own_input=True)
        q = self.emb_encoder(q, q_timing, q_mask, own_input=True)
        if packed is not None:
            c = packed.unpack(c, c_mask.shape)

        x = self.dropout(self.cq_resize(self.cq_attention(c, q, c_mask, q_mask)))
        if packed is not None:
            x = packed.pack(x)
        m0 = self._model_pass(x, c_timing, c_rows, packed)
        m1 = self._model_pass(m0, c_timing, c_rows, packed)
        m2 = self._model_pass(m1, c_timing, c_rows, packed)
        if packed is not None:
            m0, m1, m2 = (packed.unpack(m, c_mask.shape) for m in (m0, m1, m2))

        start_in, end_in = torch.cat([m0, m1], dim=-1), torch.cat([m0, m2], dim=-1)
        start, end = self.start_head(start_in).squeeze(-1), self.end_head(end_in).squeeze(-1)  # [B, n]
        mask = c_mask
        if self.config.no_answer:
            start = torch.cat([self.null_start(self._max_pool(start_in, c_mask)), start], dim=1)
            end = torch.cat([self.null_end(self._max_pool(end_in, c_mask)), end], dim=1)
            mask = torch.cat([c_mask.new_ones(c_mask.shape[0], 1), c_mask], dim=1)
        low, padding = torch.finfo(start.dtype).min, ~mask
        start, end = start.masked_fill(padding, low), end.masked_fill(padding, low)
        if logits:
            return start, end
        return F.log_softmax(start, dim=-1), F.log_softmax(end, dim=-1)

    def training_targets(self, context_words: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The targets QANet learns: the gold span's, as they are (the QA pipeline asks every reader)."""
        return starts, ends

    @staticmethod
    def _max_pool(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: [B, n, C]; mask: [B, n] bool -> max over the real positions, [B, C] (0 for an empty row)."""
        pooled = x.masked_fill(~mask.unsqueeze(-1), torch.finfo(x.dtype).min).amax(dim=1)
        return torch.where(mask.any(dim=1, keepdim=True), pooled, torch.zeros_like(pooled))

    def extra_repr(self) -> str:
        return f"layers={self.layer_impl!r}"
