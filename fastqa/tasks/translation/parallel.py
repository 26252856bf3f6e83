"""Parallel text for translation: read, tokenize, build vocabularies, numericalise, batch.

Files hold one sentence per line (UTF-8, plain or ``.gz``); line i of the source file translates to line
i of the target file. Tokens come from spaCy's rule-based tokenizers (:mod:`fastqa.data.tokenize`),
optionally lowercased (the Multi30k tutorial lowercased both sides). Vocabularies start with the four
specials in a fixed order, so their ids are the model's: ``<pad>`` 0, ``<unk>`` 1, ``<sos>`` 2, ``<eos>`` 3.

Sequence layout (training and decoding agree on it):
  source  = tokens + <eos>                     (the encoder sees where the sentence ends)
  tgt_in  = <sos> + tokens                     (teacher forcing input)
  tgt_out = tokens + <eos>                     (what the decoder must predict)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ...data.batching import bucket_batches, pad
from ...data.files import read_text
from ...data.tokenize import tokenize
from ...data.vocab import EOS, PAD, SOS, UNK, Vocab
from ...errors import UserError

__all__ = ["SPECIALS", "read_lines", "read_parallel", "guess_lang", "tokenize_line", "tokenize_lines", "build_vocabs",
           "ParallelData", "MTBatch", "encode_source", "collate"]

# The model's ids: pad 0, unk 1, sos 2, eos 3 (ConvS2SConfig's defaults).
SPECIALS = (PAD, UNK, SOS, EOS)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file (plain or gzip, by content), without their line endings.

    Raises UserError naming the file when it is missing, unreadable, not UTF-8, or empty.
    """
    path = os.fspath(path)
    text = read_text(path)
    if not text:
        raise UserError(f"{path}: the file is empty (expected one sentence per line)")
    # splitlines would also split on \x0b, \x1c, U+2028...: only \n (and a \r before it) ends a line here.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Source and target lines; UserError naming both files and both counts when they differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{os.fspath(src_path)} has {len(src)} lines but {os.fspath(tgt_path)} has {len(tgt)}: "
                        f"a parallel corpus needs one target line per source line")
    return src, tgt


def guess_lang(path: str | os.PathLike, arg: str) -> str:
    """The language code a parallel file's name ends in (``train.de.gz`` -> "de"), for spaCy's tokenizer."""
    name = Path(path).name
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix.lstrip(".").lower()
    if suffix.isalpha():
        import spacy.util

        try:
            spacy.util.get_lang_class(suffix)  # only a language spaCy has a tokenizer for
            return suffix
        except Exception:
            pass
    raise UserError(f"{path}: cannot tell the language from the file name; pass {arg} (e.g. {arg} en)")


def tokenize_line(text: str, lang: str, *, lowercase: bool = True) -> list[str]:
    """One sentence -> its spaCy tokens (lowercased when asked)."""
    toks = [t for t, _ in tokenize(text, lang)]
    return [t.lower() for t in toks] if lowercase else toks


def tokenize_lines(lines: Iterable[str], lang: str, *, lowercase: bool = True) -> list[list[str]]:
    return [tokenize_line(ln, lang, lowercase=lowercase) for ln in lines]


def build_vocabs(src_tokens: Iterable[Sequence[str]], tgt_tokens: Iterable[Sequence[str]], *, min_freq: int = 2,
                 max_size: int | None = None) -> tuple[Vocab, Vocab]:
    """Source and target vocabularies from the training tokens: specials 0..3, then tokens seen at least
    ``min_freq`` times (the tutorial used 2), most frequent first."""
    return (Vocab.build(src_tokens, min_freq=min_freq, max_size=max_size, specials=SPECIALS),
            Vocab.build(tgt_tokens, min_freq=min_freq, max_size=max_size, specials=SPECIALS))


def encode_source(tokens: Sequence[str], vocab: Vocab) -> list[int]:
    """Source tokens -> ids + <eos>; unknown tokens become <unk>."""
    return vocab.encode(tokens) + [vocab.id_of(EOS)]


@dataclass
class MTBatch:
    """src: [B, S] ids (+<eos>, right-padded); tgt_in: [B, T] (<sos> + ids); tgt_out: [B, T] (ids + <eos>)."""
    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor

    def to(self, device: torch.device | str) -> "MTBatch":
        return MTBatch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device))


class ParallelData:
    """Numericalised sentence pairs. src[i]: ids + <eos>; tgt[i]: ids (no specials)."""

    def __init__(self, src: list[list[int]], tgt: list[list[int]], src_vocab: Vocab, tgt_vocab: Vocab) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"src and tgt must have the same length, got {len(src)} and {len(tgt)}")
        self.src, self.tgt = src, tgt
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab

    @classmethod
    def from_tokens(cls, src_tokens: Sequence[Sequence[str]], tgt_tokens: Sequence[Sequence[str]],
                    src_vocab: Vocab, tgt_vocab: Vocab, *, max_len: int | None = None,
                    drop_empty: bool = True) -> "ParallelData":
        """Numericalise token lists. ``max_len`` (training only) drops pairs whose source + <eos> or target
        + <eos> is longer; ``drop_empty`` drops pairs with an empty side (nothing to learn from)."""
        src, tgt = [], []
        for s, t in zip(src_tokens, tgt_tokens):
            if drop_empty and (not s or not t):
                continue
            if max_len is not None and (len(s) + 1 > max_len or len(t) + 1 > max_len):
                continue
            src.append(encode_source(s, src_vocab))
            tgt.append(tgt_vocab.encode(t))
        return cls(src, tgt, src_vocab, tgt_vocab)

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> list[int]:
        """Per pair, the longer side (with its <eos>/<sos>): what padding a batch to it costs."""
        return [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]

    def batches(self, batch_size: int, *, seed: int, epoch: int = 0, shuffle: bool = True) -> list[list[int]]:
        return bucket_batches(self.lengths(), batch_size, seed=seed, epoch=epoch, shuffle=shuffle)

    def collate(self, indices: Sequence[int]) -> MTBatch:
        return collate([self.src[i] for i in indices], [self.tgt[i] for i in indices], self.tgt_vocab)

    def num_target_tokens(self) -> int:
        """Tokens the decoder predicts over the whole set (targets + one <eos> each)."""
        return sum(len(t) + 1 for t in self.tgt)


def collate(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], tgt_vocab: Vocab) -> MTBatch:
    """Pad a batch: src as given (already ending in <eos>), tgt_in = <sos> + t, tgt_out = t + <eos>."""
    pad_id, sos, eos = tgt_vocab.pad_id, tgt_vocab.id_of(SOS), tgt_vocab.id_of(EOS)
    return MTBatch(src=pad(src, pad_id),
                   tgt_in=pad([[sos, *t] for t in tgt], pad_id),
                   tgt_out=pad([[*t, eos] for t in tgt], pad_id))
