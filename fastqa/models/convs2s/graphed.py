"""The incremental decoding step through static buffers, captured as a CUDA graph per row bucket.

A decoding step is ~10 small launches per decoder layer; on a GPU the host issuing them is the step's time.
``StaticDecoding`` keeps, per (mode, rows per sentence, sentences bucket, source-length bucket), static buffers
for everything a step reads and writes -- the newest tokens, the position (a device tensor, advanced in place),
the rolling convolution states (updated in place), the encoder output and the folded attention memory (padded
to the bucket; the attention's mask keeps the padding out), and the step's outputs -- and on CUDA captures the
step once per key and replays it. Graphs are kept across calls (capturing costs more than a search of a few
hundred sentences), so a key's first step runs eagerly through its buffers and the second captures.

The search around the step (``decoding``) is unchanged: it sees a ``StaticState`` with ``DecoderState``'s
``select`` and ``reorder`` (both in place; ``select`` moves to a smaller bucket when the live sentences fit one)
and reads the first rows of the step's outputs. Rows past the live ones hold finished or earlier sentences:
every op of the step is row-wise, so they change nothing and are never read.

Weight normalisation: the captured step computes the normalised weights from the parameters itself (the
search's ``parametrize.cached()`` values are freed when the search ends; a graph must not read them).
On the CPU there is nothing to capture: the same buffers run eagerly (what the tests compare with today's
decoder, token for token).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..static_buffers import PerModelStatic
from .modeling import ConvS2S
from .state import DecoderState, EncoderOut

__all__ = ["StaticDecoding", "StaticState", "sentence_bucket", "source_bucket"]

#: Source lengths are padded up to a multiple of this.
SOURCE_MULTIPLE = 16
#: Keys one model keeps buffers (and graphs) for; past it the least recently used key is dropped.
MAX_ENTRIES = 48


def sentence_bucket(n: int) -> int:
    """The static sentences for n live ones: a power of two up to 32, then a multiple of 32 (few graphs, little
    padding at the batch sizes decoding runs)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n - 1).bit_length() if n <= 32 else -(-n // 32) * 32


def source_bucket(s: int, max_positions: int) -> int:
    """The static source length for sources of s tokens (a multiple of ``SOURCE_MULTIPLE``, at most the model's
    positions unless s itself is more)."""
    return max(s, min(-(-s // SOURCE_MULTIPLE) * SOURCE_MULTIPLE, max_positions))


@dataclass
class _Entry:
    """One key's static buffers, its graph once captured, and how often it ran eagerly."""

    keys: torch.Tensor                      # [R, Sb, E]
    values: torch.Tensor                    # [R, Sb, E]
    mask: torch.Tensor                      # [R, Sb] bool
    memory: list[tuple[torch.Tensor, ...]]  # per layer (keys [R, Sb, H], bias [R, 1, Sb], values [R, Sb, H])
    conv_states: list[torch.Tensor]         # per layer [R * r, K-1, H]
    tokens: torch.Tensor                    # [R * r] int64
    pos: torch.Tensor                       # [1] int64: the position of the next token
    out: torch.Tensor | None = None         # [R * r] int64 (greedy's argmax) or [R * r, V] logits
    attn: torch.Tensor | None = None        # [R * r, Sb]
    graph: Any = None
    runs: int = 0
    failed: bool = False
    weights: tuple = field(default=())      # the parameters' storages when built (a moved model rebuilds)


class StaticDecoding(PerModelStatic):
    """The static-buffer decoding steps of one model (``StaticDecoding.of(model)``: one per model and thread --
    two searches at once must not share buffers --, kept while the model lives). capture: capture graphs
    (default: on CUDA)."""

    def __init__(self, model: ConvS2S, *, capture: bool | None = None) -> None:
        super().__init__(model, capture=capture)
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()   # least recently used first

    def _weights(self) -> tuple:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def entry(self, mode: tuple, r: int, sentences: int, src_len: int, like: DecoderState) -> _Entry:
        """The entry of ``sentences`` static sentences of ``src_len`` source positions (buffers shaped after
        ``like``), built on first use. A model whose parameters moved gets its entries rebuilt."""
        key = (mode, r, sentences, src_len, like.encoder.keys.dtype, bool(like.memory))
        found = self.entries.get(key)
        if found is not None and found.weights == self._weights():
            self.entries.move_to_end(key)
            return found
        enc = like.encoder
        rows = sentences * r
        keys = enc.keys.new_zeros((sentences, src_len, enc.keys.shape[2]))
        memory = [tuple(t.new_zeros((sentences, *t.shape[1:-1], src_len) if i == 1 else
                                    (sentences, src_len, t.shape[2])) for i, t in enumerate(layer))
                  for layer in like.memory]
        entry = _Entry(keys=keys, values=torch.zeros_like(keys),
                       mask=torch.ones((sentences, src_len), dtype=torch.bool, device=keys.device),  # finite rows
                       memory=memory, conv_states=[s.new_zeros((rows, *s.shape[1:])) for s in like.conv_states],
                       tokens=torch.zeros(rows, dtype=torch.long, device=keys.device),
                       pos=torch.zeros(1, dtype=torch.long, device=keys.device), weights=self._weights())
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > MAX_ENTRIES:
            self.entries.popitem(last=False)
        return entry

    def start(self, state: DecoderState, argmax_exclude: Sequence[int] | None) -> "StaticState":
        """The static state for a search that starts at ``state`` (``ConvS2S.initial_state``, incremental).
        argmax_exclude: as ``decode_step``'s (greedy search: the step yields the argmax), or None (logits)."""
        if not state.conv_states:
            raise ValueError("static decoding needs an incremental state (incremental=True)")
        mode = ("argmax", tuple(argmax_exclude)) if argmax_exclude is not None else ("logits",)
        b, s = state.encoder.keys.shape[:2]
        src_len = source_bucket(s, self.model.config.max_positions)
        entry = self.entry(mode, state.rows_per_sentence, sentence_bucket(b), src_len, state)
        st = StaticState(self, mode, entry, sentences=b, src_len=s, rows_per_sentence=state.rows_per_sentence)
        everyone = torch.arange(b, device=entry.keys.device)
        st._load(state.encoder, state.memory, state.conv_states, everyone)
        entry.pos.fill_(state.step)
        return st


class StaticState:
    """A search's decoder state in a ``StaticDecoding`` entry: ``sentences`` live ones in its first rows.
    ``step`` runs one decoding step; ``select`` and ``reorder`` act in place (``DecoderState``'s meaning)."""

    def __init__(self, owner: StaticDecoding, mode: tuple, entry: _Entry, *, sentences: int, src_len: int,
                 rows_per_sentence: int) -> None:
        self.owner, self.mode, self.entry = owner, mode, entry
        self.sentences, self.src_len, self.rows_per_sentence = sentences, src_len, rows_per_sentence

    @property
    def rows(self) -> int:
        return self.sentences * self.rows_per_sentence

    def _row_index(self, sentences: torch.Tensor) -> torch.Tensor:
        r = self.rows_per_sentence
        return (sentences.unsqueeze(1) * r + torch.arange(r, device=sentences.device)).reshape(-1)

    def _load(self, enc: EncoderOut, memory: list[tuple[torch.Tensor, ...]], conv_states: list[torch.Tensor],
              sentences: torch.Tensor) -> None:
        """Copy sentences ``sentences`` of (enc, memory, conv_states) into this entry's first rows (source
        positions past ``src_len``: zeros, masked)."""
        e, b, s = self.entry, sentences.numel(), self.src_len
        e.keys[:b].zero_()
        e.values[:b].zero_()
        e.mask[:b].fill_(False)
        e.keys[:b, :s] = enc.keys.index_select(0, sentences)
        e.values[:b, :s] = enc.values.index_select(0, sentences)
        e.mask[:b, :s] = enc.mask.index_select(0, sentences)
        for static, layer in zip(e.memory, memory):
            for i, (dst, src) in enumerate(zip(static, layer)):
                dst[:b].zero_()
                (dst[:b, :, :s] if i == 1 else dst[:b, :s]).copy_(src.index_select(0, sentences))
        rows = self._row_index(sentences)
        for dst, src in zip(e.conv_states, conv_states):
            dst[:rows.numel()] = src.index_select(0, rows)

    def select(self, sentences: torch.Tensor) -> "StaticState":
        """Only the live sentences ``sentences`` ([B'] int64, indices among the live ones), in place; into a
        smaller bucket's entry when they fit one."""
        e = self.entry
        b = sentences.numel()
        bucket = sentence_bucket(b)
        if bucket < e.keys.shape[0]:
            like = DecoderState(EncoderOut(e.keys, e.values, e.mask), e.conv_states, 0, self.rows_per_sentence,
                                e.memory)
            target = self.owner.entry(self.mode, self.rows_per_sentence, bucket, e.keys.shape[1], like)
            moved = StaticState(self.owner, self.mode, target, sentences=b, src_len=e.keys.shape[1],
                                rows_per_sentence=self.rows_per_sentence)
            moved._load(EncoderOut(e.keys, e.values, e.mask), e.memory, e.conv_states, sentences)
            target.pos.copy_(e.pos)
            moved.src_len = self.src_len
            return moved
        rows = self._row_index(sentences)
        for t in (e.keys, e.values, e.mask, *(x for layer in e.memory for x in layer)):
            t[:b] = t.index_select(0, sentences)
        for t in e.conv_states:
            t[:rows.numel()] = t.index_select(0, rows)
        self.sentences = b
        return self

    def reorder(self, order: torch.Tensor, *, check: bool = False) -> "StaticState":
        """Row i of the live rows takes live row order[i]'s convolution states ([N] int64, rows kept within
        their sentence by the caller: beam search's reordering), in place."""
        if order.dtype != torch.long or order.shape != (self.rows,):
            raise ValueError(f"order must be a [{self.rows}] int64 tensor, got {order.dtype} of shape "
                             f"{tuple(order.shape)}")
        for t in self.entry.conv_states:
            t[:self.rows] = t.index_select(0, order)
        return self

    # -- the step
    def _compute(self) -> None:
        """The captured region: one decoder step from the entry's buffers into them (position advanced)."""
        e = self.entry
        state = DecoderState(EncoderOut(e.keys, e.values, e.mask), e.conv_states, e.pos,
                             self.rows_per_sentence, e.memory)
        exclude = self.mode[1] if self.mode[0] == "argmax" else None
        out, attn, new = self.owner.model.decoder.step(e.tokens, state, exclude)
        for dst, src in zip(e.conv_states, new.conv_states):
            dst.copy_(src)
        e.pos.add_(1)
        if e.out is None:  # first (eager) run: the output buffers take the step's shapes
            e.out, e.attn = torch.empty_like(out), torch.empty_like(attn)
        e.out.copy_(out)
        e.attn.copy_(attn)

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [N] (the newest token of each live row) -> (argmax [N] or logits [N, V], attention [N, S]);
        views of the entry's outputs, valid until the next step."""
        e, n = self.entry, self.rows
        e.tokens[:n].copy_(tokens)
        owner = self.owner
        if e.graph is not None:
            e.graph.replay()
            owner.replays += 1
        elif not owner.capture or e.failed or e.runs < 1:
            e.runs += 1
            self._compute()
        else:
            self._capture()
        return e.out[:n], e.attn[:n, :self.src_len]

    def _capture(self) -> None:
        e, owner = self.entry, self.owner
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: a server runs each model on a thread of its own, and the other model's eager work
            # (its allocations) must neither fail nor break this capture.
            with torch.cuda.graph(graph, pool=owner.pool, capture_error_mode="thread_local"):
                self._compute()
        except Exception:  # noqa: BLE001 -- whatever breaks capture, this key decodes eagerly
            e.failed = True
            torch.cuda.synchronize()
            self._compute()
            return
        if owner.pool is None:
            owner.pool = graph.pool()
        e.graph = graph
        graph.replay()  # capturing ran nothing: the replay is this step
        owner.replays += 1
