"""Text to a reader's inputs: word and character ids of tokens, one (context, question) pair encoded, and the
padding of their batches -- what the SQuAD files (``squad``), the long-context reading (``windows``) and the
answering of free text (``predictor``) share.

Words are cut to ``char_limit`` characters (the model's ``max_word_len``) in every path: the character CNN was
trained on that window, and one 8,000-character token (a URL, a base64 blob) would otherwise widen the padded
[B, n, W] character tensor of its whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..._checks import check_int, check_text
from ...data.batching import pad
from ...data.tokenize import tokenize
from ...data.vocab import Vocab

__all__ = ["EncodedPair", "encode_pairs", "encode_tokens", "pad_chars"]


def encode_tokens(tokens: Sequence[str], words: Vocab, chars: Vocab, char_limit: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Word ids [n] and char ids [n, W]: W = the longest word's length cut to ``char_limit`` (``<pad>`` filled).

    ``char_limit`` (``Limits.chars``, the model's ``max_word_len``) is required: a word is never encoded
    past the character window, so the tensor's width is bounded whatever the text holds.
    """
    char_limit = check_int("char_limit", char_limit, low=1)
    word_ids = torch.tensor(words.encode(tokens), dtype=torch.long)
    char_ids = (pad([chars.encode(t[:char_limit]) for t in tokens], chars.pad_id) if tokens
                else torch.zeros(0, 1, dtype=torch.long))
    return word_ids, char_ids


def pad_chars(seqs: Sequence[torch.Tensor], pad_id: int) -> torch.Tensor:
    """[n_i, W_i] char-id tensors -> [B, max n, max W] (at least [B, 1, 1]), ``pad_id`` filled."""
    n = max([1, *(s.shape[0] for s in seqs)])
    w = max([1, *(s.shape[1] for s in seqs)])
    out = torch.full((len(seqs), n, w), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :s.shape[0], :s.shape[1]] = s
    return out


@dataclass(frozen=True)
class EncodedPair:
    """A (context, question) pair as a reader reads it."""

    context_words: torch.Tensor        # [n]
    context_chars: torch.Tensor        # [n, W]
    question_words: torch.Tensor       # [m]
    question_chars: torch.Tensor       # [m, W']
    offsets: list[tuple[int, int]]     # each context token's character span in the context
    context_tokens: list[str]
    question_tokens: list[str]

    def __len__(self) -> int:
        return len(self.context_tokens)


def encode_pairs(contexts: Sequence[str], questions: Sequence[str], words: Vocab, chars: Vocab, char_limit: int
                 ) -> list[EncodedPair]:
    """Each (context, question) pair tokenised (offsets kept) and encoded; a context given several times (many
    questions about one text) is tokenised and encoded once, its pairs sharing the tensors. Text that is not str,
    not Unicode or has no token is a ``TypeError``/``UserError`` naming it (and the pair, when there are
    several)."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]], list[str]]] = {}
    out = []
    for i, (context, question) in enumerate(zip(contexts, questions)):
        where = f" (pair {i})" if len(contexts) > 1 else ""
        if not isinstance(context, str) or not isinstance(question, str):
            raise TypeError(f"context and question must be str{where}")
        if context not in seen:
            ctx = tokenize(check_text("the context", context, where=where, blank=True))
            cw, cc = encode_tokens([t for t, _ in ctx], words, chars, char_limit)
            seen[context] = (cw, cc, [(s, s + len(t)) for t, s in ctx], [t for t, _ in ctx])
        q = tokenize(check_text("the question", question, where=where, blank=True))
        qw, qc = encode_tokens([t for t, _ in q], words, chars, char_limit)
        cw, cc, offsets, tokens = seen[context]
        out.append(EncodedPair(cw, cc, qw, qc, offsets, tokens, [t for t, _ in q]))
    return out
