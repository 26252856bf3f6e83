"""BLEU for translation output: sacrebleu on detokenized text, and the tutorial's tokenized BLEU.

Two scores, because they answer different questions:

* :func:`corpus_bleu` -- sacrebleu's corpus BLEU on *detokenized* hypotheses against the raw reference
  lines (sacrebleu tokenizes both itself, ``13a`` by default). This is the comparable, reproducible
  number; its signature says how it was computed. The model's tokens are joined back into text with
  :func:`detokenize` (sacremoses' Moses detokenizer).
* :func:`tokenized_bleu` -- BLEU over token lists, as the Multi30k ConvS2S tutorial computed it with
  torchtext's ``bleu_score`` (its 33.3): 4-gram, uniform weights 1/4, no smoothing, n-gram counts clipped
  and summed over the corpus, brevity penalty ``exp(1 - r/c)`` when the corpus is shorter than its
  references, on lowercased spaCy tokens. Set beside the tutorial's figure, not beside papers.

How the second matches torchtext: torchtext's ``bleu_score(candidates, [[ref] ...])`` is exactly corpus
BLEU with one reference per sentence, no smoothing, and a score of 0 when any n-gram order has no match.
sacrebleu with ``tokenize="none"`` splits each line on whitespace, so feeding it the space-joined token
lists gives it the same n-grams; with ``smooth_method="none"`` and ``effective_order=False`` (its corpus
default) it computes the same precisions, the same brevity penalty (single reference: the closest length
is the only length), and 0 when an order has no match. ``tests/models/test_mt_bleu.py`` checks this
against an independent pure-Python implementation of torchtext's formula on random corpora and against
hand-computed cases. Tokens must contain no whitespace -- spaCy's tokens (whitespace tokens dropped, see
:func:`fastqa.data.tokenize.tokenize`) never do; any that would are rejected rather than silently split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["BleuResult", "corpus_bleu", "tokenized_bleu"]


@dataclass(frozen=True)
class BleuResult:
    """score: BLEU in [0, 100]; line: sacrebleu's one-line report (signature = score, precisions, BP)."""
    score: float
    precisions: tuple[float, ...]
    bp: float
    sys_len: int
    ref_len: int
    signature: str
    line: str


def _check_pair(hypotheses: Sequence, references: Sequence) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be sequences of sentences, not a single str")
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references must have the same number of sentences, "
                         f"got {len(hypotheses)} hypotheses and {len(references)} references")


def _score(bleu, hypotheses: list[str], references: list[str]) -> BleuResult:
    s = bleu.corpus_score(hypotheses, [references])
    sig = str(bleu.get_signature())
    return BleuResult(score=float(s.score), precisions=tuple(float(p) for p in s.precisions), bp=float(s.bp),
                      sys_len=int(s.sys_len), ref_len=int(s.ref_len), signature=sig,
                      line=s.format(signature=sig))


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], *, lowercase: bool = False,
                tokenize: str = "13a") -> BleuResult:
    """sacrebleu corpus BLEU of detokenized ``hypotheses`` against one reference line each.

    ``lowercase=True`` scores case-insensitively (the signature then says ``case:lc``): use it for a
    model trained on lowercased text, whose output cannot match the references' capitals.
    """
    from sacrebleu.metrics import BLEU

    _check_pair(hypotheses, references)
    return _score(BLEU(lowercase=lowercase, tokenize=tokenize), list(hypotheses), list(references))


def tokenized_bleu(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[str]], *,
                   lowercase: bool = True) -> BleuResult:
    """The tutorial's BLEU (torchtext ``bleu_score`` semantics, x100) over token lists.

    hypotheses[i], references[i]: the tokens of sentence i (one reference each). ``lowercase`` lowercases
    both sides first (the tutorial's fields were lowercased).
    """
    from sacrebleu.metrics import BLEU

    _check_pair(hypotheses, references)
    lines = []
    for side, corpus in (("hypotheses", hypotheses), ("references", references)):
        joined = []
        for i, toks in enumerate(corpus):
            if isinstance(toks, str):
                raise TypeError(f"{side}[{i}] must be a list of tokens, got a str")
            for t in toks:
                if not t or t != "".join(t.split()):
                    raise ValueError(f"{side}[{i}]: token {t!r} is empty or contains whitespace")
            line = " ".join(toks)
            joined.append(line.lower() if lowercase else line)
        lines.append(joined)
    # force=True: the input is tokenized on purpose; sacrebleu would otherwise warn that it looks tokenized.
    bleu = BLEU(tokenize="none", smooth_method="none", effective_order=False, force=True)
    return _score(bleu, lines[0], lines[1])
