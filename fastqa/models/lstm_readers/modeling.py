"""The attention tutorial's recurrent QA baselines, as readers of the QA pipeline (same inputs and outputs as QANet).

LSTMReader(config), config.variant:

    [question; <SEP>; context] words ─► frozen word vectors (trainable <unk>, learned <SEP>) ─► 2-layer LSTM
        lstm            last state h ─► linear ─► tied output layer (h' · E^T + b): a score per vocabulary word
        lstm-attention  [h; attention summary of all states, query h] ─► linear ─► tied output layer
        lstm-pointer    attention logits over the context positions (query h): start (and end) pointers

Each example is packed without padding between its question and its context (``pack_padded_sequence``), so
its states and its answer do not depend on how far the batch pads either part. forward returns what QANet
returns, (log_p_start, log_p_end) over the context positions ([B, n], or [B, 1 + n] with a no-answer
option), so decoding, prediction, the metric and ``ask`` are the pipeline's. The vocabulary models score
words: log_p_start[b, i] is the log-probability (over the vocabulary) of the word at context position i, and
positions holding <pad> or <unk> are excluded, so only words of the context can be answers. Single-word
models give log_p_end = 0 (log 1) at every real position: the end is the start.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..blocks import FrozenWordVectors, init_linear, masked_log_softmax
from ..checks import check_config, check_qa_inputs
from ..regularization import dropout
from .config import LSTMReaderConfig

__all__ = ["LSTMReader"]


def _masked_attention(query: torch.Tensor, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product logits of ``query`` [B, H] against ``states`` [B, T, H] -> [B, T] (not normalised;
    masked positions hold the dtype's lowest value)."""
    logits = torch.einsum("bth,bh->bt", states, query) / math.sqrt(states.shape[-1])
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


class LSTMReader(FrozenWordVectors):
    """A recurrent QA baseline (see the module docstring): ``LSTMReader(config)``, config an LSTMReaderConfig.

    forward(context_words, context_chars, question_words, question_chars) -> (log_p_start, log_p_end), like
    QANet (the characters are accepted and not read). ``single_word`` models' answers are one token.
    """

    def __init__(self, config: LSTMReaderConfig) -> None:
        super().__init__()
        check_config("LSTMReader", config, LSTMReaderConfig)
        self.config = c = config
        self._make_word_vectors(c.word_vocab_size, c.word_dim, pad_id=c.pad_id, unk_id=c.unk_id)
        self.sep_vector = nn.Parameter(torch.empty(c.word_dim))
        self.lstm = nn.LSTM(c.word_dim, c.hidden_dim, c.num_layers, batch_first=True,
                            dropout=c.dropout if c.num_layers > 1 else 0.0)
        H = c.hidden_dim
        summary = 2 * H if c.variant == "lstm-attention" else H
        if c.scores_vocabulary:
            # Tied output layer: features -> word space, scored against the (frozen) word table, plus a bias.
            self.output = init_linear(nn.Linear(summary, c.word_dim))
            self.output_bias = nn.Parameter(torch.zeros(c.word_vocab_size))
        else:
            self.start_query = init_linear(nn.Linear(H, H))
            if c.pointer_span:
                self.end_query = init_linear(nn.Linear(H, H))
        if c.no_answer:
            self.null_score = init_linear(nn.Linear(summary, 1 if c.single_word else 2))
        self._init_word_vectors()
        with torch.no_grad():
            nn.init.normal_(self.sep_vector, std=c.word_dim ** -0.5)

    # -- reading
    def _read(self, cw: torch.Tensor, qw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the LSTM over [question; <SEP>; context] of every row, packed.

        cw: [B, n]; qw: [B, m] -> (states [B, T, H] with T = m + 1 + n, zero past each row's length;
        seq_mask [B, T] bool; context_at [B, n] int64: the position in ``states`` of each context token).
        """
        pad = self.config.pad_id
        B, m = qw.shape
        n = cw.shape[1]
        q_len, c_len = (qw != pad).sum(1), (cw != pad).sum(1)
        # Every row: its question's tokens, then <SEP>, then its context's tokens, then padding.
        parts = torch.cat([self.embed_words(qw), self.sep_vector.expand(B, 1, -1).to(self.word_vectors.dtype),
                           self.embed_words(cw)], dim=1)                                   # [B, m + 1 + n, D]
        T = m + 1 + n
        t = torch.arange(T, device=cw.device).unsqueeze(0)
        ql = q_len.unsqueeze(1)
        lengths = q_len + 1 + c_len
        seq_mask = t < lengths.unsqueeze(1)
        source = torch.where(t < ql, t, torch.where(t == ql, m, m + t - ql))
        source = torch.where(seq_mask, source, m)  # padding reads <SEP> (never used: packed away)
        x = parts.gather(1, source.unsqueeze(-1).expand(-1, -1, parts.shape[-1]))
        x = dropout(x, self.config.dropout, self.training)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = pad_packed_sequence(states, batch_first=True, total_length=T)
        context_at = (ql + 1 + torch.arange(n, device=cw.device).unsqueeze(0)).clamp(max=T - 1)
        return states, seq_mask, context_at

    @staticmethod
    def _last_state(states: torch.Tensor, seq_mask: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> the state at each row's last real position, [B, H]."""
        last = seq_mask.sum(1) - 1
        return states.gather(1, last.view(-1, 1, 1).expand(-1, 1, states.shape[-1])).squeeze(1)

    def forward(self, context_words: torch.Tensor, context_chars: torch.Tensor, question_words: torch.Tensor,
                question_chars: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context_words: [B, n]; context_chars: [B, n, W] (not read); question_words: [B, m]; question_chars:
        [B, m, W'] (not read); int64 ids, ``pad_id`` = padding. Returns (log_p_start, log_p_end): [B, n], or
        [B, 1 + n] with ``no_answer`` (index 0 = no answer); positions that cannot be answers have a finite
        log-prob whose exp is exactly 0."""
        cw, _, qw, _ = check_qa_inputs("LSTMReader", context_words, context_chars, question_words, question_chars)
        c = self.config
        states, seq_mask, context_at = self._read(cw, qw)
        last = self._last_state(states, seq_mask)                                            # [B, H]
        features = last
        if c.variant == "lstm-attention":
            weights = F.softmax(_masked_attention(last, states, seq_mask), dim=1)
            features = torch.cat([last, torch.einsum("bt,bth->bh", weights, states)], dim=1)  # [B, 2H]
        features = dropout(features, c.dropout, self.training)
        null = self.null_score(features) if c.no_answer else None                           # [B, 1 or 2]

        if c.scores_vocabulary:
            # The context words' log-probabilities among all vocabulary words (and "no answer").
            out = self.output(features)                                                    # [B, D]
            # Scored against the frozen table as it is (its <unk> row is zero), then <unk>'s own vector added:
            # no [V, D] copy of the table per step.
            logits = torch.addmm(self.output_bias.to(out.dtype), out, self.word_vectors.t().to(out.dtype))
            unk = torch.tensor([c.unk_id], device=out.device)
            logits = logits.index_add(1, unk, (out @ self.unk_vector.to(out.dtype)).unsqueeze(1))
            if null is not None:
                logits = torch.cat([null, logits], dim=1)
            log_p = F.log_softmax(logits, dim=1)
            shift = 1 if null is not None else 0
            can_answer = (cw != c.pad_id) & (cw != c.unk_id)
            start = log_p.gather(1, cw + shift).masked_fill(~can_answer, torch.finfo(log_p.dtype).min)
            if null is not None:
                start = torch.cat([log_p[:, :1], start], dim=1)
                can_answer = torch.cat([can_answer.new_ones(can_answer.shape[0], 1), can_answer], dim=1)
            return start, self._end_is_start(can_answer, start.dtype)

        # Pointer: attention logits over the context positions only (never the question, <SEP> or padding).
        context_states = states.gather(1, context_at.unsqueeze(-1).expand(-1, -1, states.shape[-1]))
        c_mask = cw != c.pad_id
        start = _masked_attention(self.start_query(last), context_states, c_mask)
        end = _masked_attention(self.end_query(last), context_states, c_mask) if c.pointer_span else None
        mask = c_mask
        if null is not None:
            start = torch.cat([null[:, :1], start], dim=1)
            end = torch.cat([null[:, 1:], end], dim=1) if end is not None else None
            mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        log_p_start = masked_log_softmax(start, mask)
        if end is None:
            return log_p_start, self._end_is_start(mask, log_p_start.dtype)
        return log_p_start, masked_log_softmax(end, mask)

    @staticmethod
    def _end_is_start(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A single-word model's end "distribution": log 1 = 0 where an answer can be, lowest elsewhere."""
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

    def training_targets(self, context_words: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The (start, end) targets this model learns from the gold span's: a single-word model learns the
        span's first token only (the end target is dropped), and a vocabulary model cannot learn a word it
        has no entry for (a gold word that is <unk>: no target). starts/ends: [B] (NO_TARGET = -1)."""
        ends = torch.full_like(ends, -1) if self.config.single_word else ends
        if self.config.scores_vocabulary:
            shift = 1 if self.config.no_answer else 0
            at = (starts - shift).clamp(min=0).unsqueeze(1)
            unknown = (starts >= shift) & (context_words.gather(1, at).squeeze(1) == self.config.unk_id)
            starts = starts.masked_fill(unknown, -1)
        return starts, ends

    def extra_repr(self) -> str:
        return f"variant={self.config.variant!r}"
