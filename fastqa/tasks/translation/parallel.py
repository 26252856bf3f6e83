"""Parallel text for translation: read, tokenize, build vocabularies, numericalise, batch.

Files hold one sentence per line (UTF-8, plain or ``.gz``); line i of the source file translates to line
i of the target file. How text becomes the model's tokens and back is a :class:`TextCodec`, of one of two
kinds (``VOCABS``):

* ``subword`` (the default): one SentencePiece unigram model (:class:`fastqa.data.subword.SubwordModel`)
  learned on the source and target training lines together -- shared pieces, one vocabulary for both
  sides -- cased. Its byte pieces spell any character, so no input is ever ``<unk>``, and the decoder is
  never allowed to write ``<unk>`` (:attr:`TextCodec.forbid_ids`): output is readable, cased text.
* ``word``: spaCy's rule-based tokenizers (:mod:`fastqa.data.tokenize`), lowercased by default, and a
  vocabulary per side of the tokens seen ``min_freq`` times -- the Multi30k tutorial's setting, kept so its
  figures stay reproducible. Output is joined back with sacremoses' detokenizer.

Vocabularies start with the four specials in a fixed order, so their ids are the model's: ``<pad>`` 0,
``<unk>`` 1, ``<sos>`` 2, ``<eos>`` 3 (a SentencePiece model is trained with the same ids).

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
from ...data.subword import SubwordModel
from ...data.tokenize import detokenize, tokenize
from ...data.vocab import EOS, PAD, SOS, UNK, Vocab
from ...errors import UserError

__all__ = ["SPECIALS", "VOCABS", "read_lines", "read_parallel", "guess_lang", "tokenize_line", "tokenize_lines",
           "build_vocabs", "TextCodec", "ParallelData", "MTBatch", "encode_source", "collate"]

# The model's ids: pad 0, unk 1, sos 2, eos 3 (ConvS2SConfig's defaults).
SPECIALS = (PAD, UNK, SOS, EOS)

# The kinds of vocabulary a translation model can have; the first is the default.
VOCABS = ("subword", "word")

# spaCy's language-neutral tokenizer: what the tutorial's tokenized BLEU splits text with when the target
# language is not known (a subword model needs no language otherwise).
NEUTRAL_LANG = "xx"


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


def guess_lang(path: str | os.PathLike, arg: str, *, required: bool = True) -> str | None:
    """The language code a parallel file's name ends in (``train.de.gz`` -> "de"), for spaCy's tokenizer.

    When the name tells none: a UserError naming ``arg`` (the flag that gives it), or None if not ``required``.
    """
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
    if not required:
        return None
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


class TextCodec:
    """Text <-> the model's tokens for one translation model: a ``word`` or a ``subword`` vocabulary.

    kind: one of ``VOCABS``; src_lang / tgt_lang: spaCy language codes (a word codec needs both; a subword
    codec only uses the target's, for the tutorial's tokenized BLEU, and may have None); lowercase: whether
    text is lowercased before it becomes tokens; subword: the SentencePiece model (``subword`` only), shared
    by source and target.
    """

    def __init__(self, kind: str, *, src_lang: str | None, tgt_lang: str | None, lowercase: bool,
                 subword: SubwordModel | None = None) -> None:
        if kind not in VOCABS:
            raise ValueError(f"kind must be one of {VOCABS}, got {kind!r}")
        if (kind == "subword") != (subword is not None):
            raise ValueError("a subword codec needs its SubwordModel, and a word codec has none")
        if kind == "word" and not (src_lang and tgt_lang):
            raise ValueError("a word codec needs src_lang and tgt_lang (spaCy's tokenizers)")
        self.kind, self.src_lang, self.tgt_lang = kind, src_lang, tgt_lang
        self.lowercase, self.subword = bool(lowercase), subword

    # -- building -------------------------------------------------------------------------------------
    @classmethod
    def train_subword(cls, src_lines: Sequence[str], tgt_lines: Sequence[str], *, vocab_size: int,
                      src_lang: str | None, tgt_lang: str | None, lowercase: bool = False) -> "TextCodec":
        """Learn one SentencePiece unigram model on the source and target lines together (at most
        ``vocab_size`` pieces; fewer when the text is too small for more); UserError if ``vocab_size``
        cannot hold the text's characters."""
        def lines() -> Iterable[str]:
            for side in (src_lines, tgt_lines):
                for line in side:
                    yield line.lower() if lowercase else line
        try:
            model = SubwordModel.train(lines(), vocab_size=vocab_size)
        except ValueError as e:
            raise UserError(f"--vocab-size {vocab_size}: {e}") from None
        return cls("subword", src_lang=src_lang, tgt_lang=tgt_lang, lowercase=lowercase, subword=model)

    def meta(self) -> dict:
        """What a checkpoint stores to rebuild this codec: the ``text`` entry, plus for a subword model the
        ``vocab`` entry with the serialized SentencePiece model (a word model has none, as before subword
        models existed, so its runs still resume)."""
        out: dict = {"text": {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "lowercase": self.lowercase}}
        if self.subword is not None:
            out["vocab"] = {"kind": "subword", "joint": True, "sentencepiece": self.subword.to_bytes()}
        return out

    @classmethod
    def from_meta(cls, meta: dict) -> "TextCodec":
        """The codec of a checkpoint's ``meta`` (no ``vocab`` entry: a word model). ValueError/KeyError/
        TypeError when the entries are missing or damaged."""
        text = meta["text"]
        vocab = meta.get("vocab")
        if vocab is None or vocab.get("kind") == "word":
            return cls("word", src_lang=text["src_lang"], tgt_lang=text["tgt_lang"], lowercase=text["lowercase"])
        if vocab.get("kind") != "subword":
            raise ValueError(f"unknown vocabulary kind {vocab.get('kind')!r} (expected one of {VOCABS})")
        return cls("subword", src_lang=text.get("src_lang"), tgt_lang=text.get("tgt_lang"),
                   lowercase=text.get("lowercase", False), subword=SubwordModel.from_bytes(vocab["sentencepiece"]))

    def vocabs(self, src_tokens: Iterable[Sequence[str]], tgt_tokens: Iterable[Sequence[str]], *,
               min_freq: int = 2) -> tuple[Vocab, Vocab]:
        """(source, target) vocabularies: a word codec's from the training tokens (``min_freq``); a subword
        codec's are its model's pieces, the same for both sides."""
        if self.subword is not None:
            vocab = self.subword.to_vocab()
            return vocab, vocab
        return build_vocabs(src_tokens, tgt_tokens, min_freq=min_freq)

    # -- using ----------------------------------------------------------------------------------------
    def _tokens(self, text: str, lang: str | None) -> list[str]:
        if not isinstance(text, str):
            raise TypeError(f"sentences must be str, got {type(text).__name__}")
        if not text.strip():
            return []
        if self.subword is not None:
            return self.subword.encode(text.lower() if self.lowercase else text)
        return tokenize_line(text, lang or NEUTRAL_LANG, lowercase=self.lowercase)

    def source_tokens(self, text: str, *, restore_case: bool = False) -> list[str]:
        """One source sentence -> the model's tokens (spaCy words or pieces; no <eos>). Blank text: [].
        ``restore_case``: a cased subword model reads a sentence typed all in lower case with the case its
        pieces make likeliest (``SubwordModel.restore_case``); training text is always read as it is."""
        if restore_case and self.subword is not None and not self.lowercase and isinstance(text, str):
            text = self.subword.restore_case(text)
        return self._tokens(text, self.src_lang)

    def target_tokens(self, text: str) -> list[str]:
        """One target sentence -> the model's tokens (what the decoder learns to write)."""
        return self._tokens(text, self.tgt_lang)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """The model's target tokens -> text: pieces joined by SentencePiece (byte pieces back into
        characters), words by sacremoses' detokenizer. Specials in ``tokens`` are dropped."""
        if self.subword is not None:
            return self.subword.decode([t for t in tokens if t not in SPECIALS])
        return detokenize([t for t in tokens if t not in (PAD, SOS, EOS)], self.tgt_lang or "en")

    @property
    def forbid_ids(self) -> tuple[int, ...]:
        """Target ids the decoder must never write: a subword model's ``<unk>`` (its pieces spell any text,
        so an unknown token would only be a wrong one); none for a word model (the tutorial's model may
        say ``<unk>`` for a word outside its vocabulary)."""
        return (SPECIALS.index(UNK),) if self.subword is not None else ()

    @property
    def bleu_lang(self) -> str:
        """The spaCy language the tutorial's tokenized BLEU splits output and references with."""
        return self.tgt_lang or NEUTRAL_LANG

    def bleu_tokens(self, tokens: Sequence[str]) -> list[str]:
        """The model's target tokens -> the tokens the tutorial's BLEU counts: a word model's own
        (lowercased) words; for a subword model, lowercased spaCy tokens of the detokenized text."""
        if self.subword is None:
            return [t.lower() for t in tokens]
        return tokenize_line(self.detokenize(tokens), self.bleu_lang, lowercase=True)

    def __repr__(self) -> str:
        what = repr(self.subword) if self.subword is not None else f"lowercase={self.lowercase}"
        return f"TextCodec({self.kind}, {self.src_lang}->{self.tgt_lang}, {what})"


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
