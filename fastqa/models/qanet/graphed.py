"""QANet's inference forward through static buffers, captured as a CUDA graph per bucket.

A reader's forward is hundreds of launches; on a GPU the host issuing them is most of a served batch's time.
``GraphedReader`` pads a batch up to a bucket -- rows to a power of two (then a multiple of 32), contexts and
questions to a multiple of ``LENGTH_MULTIPLE`` tokens, words to the model's ``max_word_len`` characters --,
copies it into that bucket's static inputs and, on CUDA, replays the forward captured for the bucket (a
bucket's first batch runs eagerly through the buffers; the second captures). Padding words are the pad id
(masked: the real positions' scores are the unpadded batch's up to rounding, padded positions score the lowest
value, so the log-probabilities' normaliser is unchanged); padding rows repeat the first row and are dropped.
The graphs are kept while the model lives (per thread), their inputs and outputs in one shared pool; a batch
past ``MAX_GRAPHS`` buckets, or one whose capture fails, runs eagerly through the buffers (logged once).

On the CPU nothing is captured: the same buffers run eagerly (what the tests compare with the plain forward).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ..static_buffers import PerModelStatic
from .modeling import QANet

__all__ = ["GraphedReader", "row_bucket", "length_bucket"]

log = logging.getLogger("fastqa.models")

#: Context and question lengths are padded up to a multiple of this.
LENGTH_MULTIPLE = 32
#: Buckets one model keeps static buffers (and graphs) for.
MAX_GRAPHS = 24


def row_bucket(n: int) -> int:
    """Static rows for a batch of n: a power of two up to 32, then a multiple of 32."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n - 1).bit_length() if n <= 32 else -(-n // 32) * 32


def length_bucket(n: int) -> int:
    """Static tokens for n: a multiple of ``LENGTH_MULTIPLE``."""
    return -(-max(n, 1) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE


@dataclass
class _Entry:
    inputs: tuple[torch.Tensor, ...]    # context words [R, N], chars [R, N, W], question words [R, M], chars [R, M, W]
    out: tuple[torch.Tensor, torch.Tensor] | None = None
    graph: Any = None
    runs: int = 0
    failed: bool = False


class GraphedReader(PerModelStatic):
    """Callable like ``QANet.forward`` (eval mode, no autograd): the forward through a bucket's static buffers.
    ``GraphedReader.of(model)``: the model's (one per thread). capture: capture graphs (default: on CUDA)."""

    def __init__(self, model: QANet, *, capture: bool | None = None, max_graphs: int = MAX_GRAPHS) -> None:
        if not isinstance(model, QANet):
            raise TypeError(f"GraphedReader reads with a QANet, got {type(model).__name__}")
        super().__init__(model, capture=capture)
        self.max_graphs = int(max_graphs)
        self.entries: dict[tuple, _Entry] = {}
        self._said: set[str] = set()

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message, *args)

    def __call__(self, context_words: torch.Tensor, context_chars: torch.Tensor, question_words: torch.Tensor,
                 question_chars: torch.Tensor, *, logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``QANet.forward`` in eval mode, without autograd: [B, n] or [B, 1 + n] scores."""
        model = self.model
        if model.training:
            raise RuntimeError("GraphedReader reads with the model in eval mode (model.eval())")
        with torch.no_grad():
            return self._read(context_words, context_chars, question_words, question_chars, logits)

    def _read(self, context_words: torch.Tensor, context_chars: torch.Tensor, question_words: torch.Tensor,
              question_chars: torch.Tensor, logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        b, n = context_words.shape
        m = question_words.shape[1]
        width = max(context_chars.shape[2], question_chars.shape[2], model.config.max_word_len)
        amp = (torch.is_autocast_enabled(context_words.device.type),
               torch.get_autocast_dtype(context_words.device.type))
        key = (logits, row_bucket(b), length_bucket(n), length_bucket(m), width, amp,
               tuple(p.data_ptr() for p in model.parameters()))
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= self.max_graphs:
                self._once("max", "graphed reader: %d buckets already hold static buffers; other shapes read "
                           "eagerly", self.max_graphs)
                return model(context_words, context_chars, question_words, question_chars, logits=logits)
            entry = self.entries[key] = _Entry(inputs=self._buffers(key, context_words))
        self._fill(entry, (context_words, context_chars, question_words, question_chars), b)
        self._run(entry, key, logits, amp)
        extra = 1 if model.config.no_answer else 0
        return entry.out[0][:b, :n + extra].clone(), entry.out[1][:b, :n + extra].clone()

    def _buffers(self, key: tuple, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _, rows, n, m, width, _, _ = key
        pad = self.model.config.pad_id

        def full(*shape: int) -> torch.Tensor:
            return torch.full(shape, pad, dtype=torch.long, device=like.device)
        return full(rows, n), full(rows, n, width), full(rows, m), full(rows, m, width)

    def _fill(self, entry: _Entry, inputs: tuple[torch.Tensor, ...], b: int) -> None:
        """The batch into the first rows (the rest padding), the first row repeated in the padding rows."""
        pad = self.model.config.pad_id
        for static, t in zip(entry.inputs, inputs):
            static.fill_(pad)
            static[(slice(0, b), *(slice(0, s) for s in t.shape[1:]))] = t
            if static.shape[0] > b:
                static[b:] = static[0]

    def _forward(self, entry: _Entry, logits: bool, amp: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        # No autocast cache: a cast cached outside the capture would be freed while the graph still reads it.
        with torch.autocast(entry.inputs[0].device.type, dtype=amp[1], enabled=amp[0], cache_enabled=False):
            return self.model(*entry.inputs, logits=logits)

    def _run(self, entry: _Entry, key: tuple, logits: bool, amp: tuple) -> None:
        if entry.graph is not None:
            entry.graph.replay()
            self.replays += 1
            return
        if not self.capture or entry.failed or entry.runs < 1:
            entry.runs += 1
            out = self._forward(entry, logits, amp)
            if entry.out is None:
                entry.out = (torch.empty_like(out[0]), torch.empty_like(out[1]))
            entry.out[0].copy_(out[0])
            entry.out[1].copy_(out[1])
            return
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: a server runs each model on a thread of its own, and the other model's eager work
            # (its allocations) must neither fail nor break this capture.
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = self._forward(entry, logits, amp)
                entry.out[0].copy_(out[0])
                entry.out[1].copy_(out[1])
        except Exception as e:  # noqa: BLE001 -- whatever breaks capture, the bucket still reads eagerly
            entry.failed = True
            log.warning("graphed reader: capturing bucket %s failed (%s: %s); it reads eagerly", key[:5],
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            torch.cuda.synchronize()
            self._run(entry, key, logits, amp)
            return
        if self.pool is None:
            self.pool = graph.pool()
        entry.graph = graph
        graph.replay()  # capturing ran nothing: the replay is this batch's forward
        self.replays += 1
