"""Scores for translation output: sacreBLEU and chrF on detokenized text, and the tutorial's tokenized BLEU.

Two kinds of score, because they answer different questions:

* :func:`corpus_scores` -- the one way to score translations: sacrebleu's corpus BLEU and chrF of
  *detokenized* hypotheses against the raw reference lines, from sacrebleu's own metric classes with
  their default settings (BLEU: cased, ``13a`` tokenization, exponential smoothing; chrF: character
  6-grams, beta 2). The numbers equal ``sacrebleu.corpus_bleu`` / ``corpus_chrf`` and the command-line
  ``sacrebleu`` on the same lines; each comes with its signature, which is what makes it comparable.
  ``lowercase=True`` gives the case-insensitive variant of both (``case:lc`` in the signatures).
* :func:`tokenized_bleu` -- BLEU over token lists, as the Multi30k ConvS2S tutorial computed it with
  torchtext's ``bleu_score`` (its 33.3): 4-gram, uniform weights 1/4, no smoothing, n-gram counts clipped
  and summed over the corpus, brevity penalty ``exp(1 - r/c)`` when the corpus is shorter than its
  references, on lowercased spaCy tokens. Set beside the tutorial's figure, not beside papers.
  :func:`text_tokenized_bleu` computes it from text (spaCy tokens of each line): how a subword model's
  detokenized output, or a translation file, is set beside the tutorial.

How the second matches torchtext: torchtext's ``bleu_score(candidates, [[ref] ...])`` is exactly corpus
BLEU with one reference per sentence, no smoothing, and a score of 0 when any n-gram order has no match.
sacrebleu with ``tokenize="none"`` splits each line on whitespace, so feeding it the space-joined token
lists gives it the same n-grams; with ``smooth_method="none"`` and ``effective_order=False`` (its corpus
default) it computes the same precisions, the same brevity penalty (single reference: the closest length
is the only length), and 0 when an order has no match. ``tests/tasks/test_mt_bleu.py`` checks this
against an independent pure-Python implementation of torchtext's formula on random corpora and against
hand-computed cases. Tokens must contain no whitespace -- spaCy's tokens (whitespace tokens dropped, see
:func:`fastqa.data.tokenize.tokenize`) never do; any that would are rejected rather than silently split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..._checks import check_bool

__all__ = ["BleuResult", "ChrfResult", "CorpusScores", "corpus_scores", "format_scores", "tokenized_bleu",
           "text_tokenized_bleu", "format_tokenized_bleu"]


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


@dataclass(frozen=True)
class ChrfResult:
    """score: chrF in [0, 100]; line: sacrebleu's one-line report (signature = score)."""
    score: float
    signature: str
    line: str


@dataclass(frozen=True)
class CorpusScores:
    """sacreBLEU and chrF of one corpus, with how they were computed (``lowercase``) and its size."""
    bleu: BleuResult
    chrf: ChrfResult
    lowercase: bool
    sentences: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``bleu``, ``chrf`` (scores), ``bleu_signature``, ``chrf_signature``, ``bleu_line``,
        ``chrf_line`` (sacrebleu's reports), BLEU's ``bleu_precisions`` and ``bleu_bp``, ``lowercase``,
        ``sentences``."""
        return {"bleu": self.bleu.score, "bleu_signature": self.bleu.signature, "bleu_line": self.bleu.line,
                "bleu_precisions": list(self.bleu.precisions), "bleu_bp": self.bleu.bp,
                "chrf": self.chrf.score, "chrf_signature": self.chrf.signature, "chrf_line": self.chrf.line,
                "lowercase": self.lowercase, "sentences": self.sentences}

    def format(self) -> str:
        """One line: ``BLEU = 34.21 (signature) | chrF = 60.12 (signature)``."""
        return format_scores(self)


def _check_lines(name: str, lines: Sequence[str]) -> list[str]:
    if isinstance(lines, (str, bytes)) or not isinstance(lines, Sequence):
        raise TypeError(f"{name} must be a list of sentences (str), got {type(lines).__name__}")
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(line).__name__}")
    return list(lines)


def _check_pair(hypotheses: Sequence, references: Sequence) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be sequences of sentences, not a single str")
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references must have the same number of sentences, "
                         f"got {len(hypotheses)} hypotheses and {len(references)} references")


def _bleu(bleu: Any, hypotheses: list[str], references: list[str]) -> BleuResult:
    s = bleu.corpus_score(hypotheses, [references])
    sig = str(bleu.get_signature())
    return BleuResult(score=float(s.score), precisions=tuple(float(p) for p in s.precisions), bp=float(s.bp),
                      sys_len=int(s.sys_len), ref_len=int(s.ref_len), signature=sig,
                      line=s.format(signature=sig))


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], *, lowercase: bool = False) -> CorpusScores:
    """sacreBLEU and chrF (sacrebleu's defaults) of detokenized ``hypotheses`` against one reference line each.

    ``lowercase=True`` scores case-insensitively (the signatures then say ``case:lc``): the figure to set
    beside a model trained on lowercased text, whose output cannot match the references' capitals.
    """
    hyps = _check_lines("hypotheses", hypotheses)
    refs = _check_lines("references", references)
    _check_pair(hyps, refs)
    if not hyps:
        raise ValueError("hypotheses and references are empty: there is nothing to score")
    check_bool("lowercase", lowercase)

    from sacrebleu.metrics import BLEU, CHRF

    bleu = _bleu(BLEU(lowercase=lowercase), hyps, refs)
    metric = CHRF(lowercase=lowercase)
    c = metric.corpus_score(hyps, [refs])
    sig = str(metric.get_signature())
    chrf = ChrfResult(score=float(c.score), signature=sig, line=c.format(signature=sig))
    return CorpusScores(bleu=bleu, chrf=chrf, lowercase=lowercase, sentences=len(hyps))


def format_scores(scores: CorpusScores | Mapping[str, Any]) -> str:
    """One line from :func:`corpus_scores` (or its ``to_dict()``, e.g. read back from JSON):
    ``BLEU = 34.21 (signature) | chrF = 60.12 (signature)``."""
    if isinstance(scores, CorpusScores):
        scores = scores.to_dict()
    if not isinstance(scores, Mapping):
        raise TypeError(f"scores must be what corpus_scores returns, got {type(scores).__name__}")
    missing = [k for k in ("bleu", "bleu_signature", "chrf", "chrf_signature") if k not in scores]
    if missing:
        raise ValueError(f"scores: not a corpus_scores result (missing {', '.join(missing)})")
    return (f"BLEU = {scores['bleu']:.2f} ({scores['bleu_signature']}) | "
            f"chrF = {scores['chrf']:.2f} ({scores['chrf_signature']})")


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
    return _bleu(bleu, lines[0], lines[1])


def text_tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> BleuResult:
    """:func:`tokenized_bleu` of text lines: both sides split into lowercased spaCy tokens of ``lang``
    (the tutorial's tokens), so detokenized output is scored as the tutorial scored its tokens."""
    from .parallel import tokenize_line

    hyps = _check_lines("hypotheses", hypotheses)
    refs = _check_lines("references", references)
    _check_pair(hyps, refs)
    return tokenized_bleu([tokenize_line(h, lang, lowercase=True) for h in hyps],
                          [tokenize_line(r, lang, lowercase=True) for r in refs], lowercase=True)


def format_tokenized_bleu(result: BleuResult) -> str:
    """The secondary report line of ``mt-eval``: the tutorial's figure with its precisions and lengths."""
    return (f"tokenized BLEU (lowercased spaCy tokens, torchtext bleu_score as the tutorial) = {result.score:.2f} "
            f"{'/'.join(f'{p:.1f}' for p in result.precisions)} (BP = {result.bp:.3f} hyp_len = {result.sys_len} "
            f"ref_len = {result.ref_len})")
