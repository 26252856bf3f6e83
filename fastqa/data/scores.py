"""Standard corpus scores for generated text: sacreBLEU and chrF, each with its signature.

Both come from sacrebleu's own metric classes (``sacrebleu.metrics.BLEU`` / ``CHRF``) with their default
settings -- BLEU: cased, ``13a`` tokenization, exponential smoothing; chrF: character 6-grams, beta 2 --
so the numbers equal ``sacrebleu.corpus_bleu`` / ``corpus_chrf`` and the command-line ``sacrebleu`` on the
same detokenized lines. ``lowercase=True`` gives the case-insensitive variant of both (``case:lc`` in the
signatures). The signature is what makes a score comparable: report it with the number.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["corpus_scores", "format_scores"]


def _check_lines(name: str, lines: Sequence[str]) -> list[str]:
    if isinstance(lines, (str, bytes)) or not isinstance(lines, Sequence):
        raise TypeError(f"{name} must be a list of sentences (str), got {type(lines).__name__}")
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(line).__name__}")
    return list(lines)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], *, lowercase: bool = False) -> dict[str, Any]:
    """sacreBLEU and chrF of ``hypotheses`` against one reference per sentence.

    Returns a JSON-ready dict: ``bleu`` and ``chrf`` (scores in [0, 100]), ``bleu_signature`` and
    ``chrf_signature`` (sacrebleu's signature strings), ``bleu_line`` and ``chrf_line`` (sacrebleu's own
    one-line reports, signature included), ``lowercase`` and ``sentences``.
    """
    hyps = _check_lines("hypotheses", hypotheses)
    refs = _check_lines("references", references)
    if len(hyps) != len(refs):
        raise ValueError(f"hypotheses and references must have the same number of sentences, "
                         f"got {len(hyps)} hypotheses and {len(refs)} references")
    if not hyps:
        raise ValueError("hypotheses and references are empty: there is nothing to score")
    if not isinstance(lowercase, bool):
        raise TypeError(f"lowercase must be a bool, got {type(lowercase).__name__}")

    from sacrebleu.metrics import BLEU, CHRF

    out: dict[str, Any] = {}
    for key, metric in (("bleu", BLEU(lowercase=lowercase)), ("chrf", CHRF(lowercase=lowercase))):
        result = metric.corpus_score(hyps, [refs])
        signature = str(metric.get_signature())
        out[key] = float(result.score)
        out[f"{key}_signature"] = signature
        out[f"{key}_line"] = result.format(signature=signature)
    out["lowercase"] = lowercase
    out["sentences"] = len(hyps)
    return out


def format_scores(scores: dict[str, Any]) -> str:
    """One line from :func:`corpus_scores`' dict: ``BLEU = 34.21 (signature) | chrF = 60.12 (signature)``."""
    if not isinstance(scores, dict):
        raise TypeError(f"scores must be the dict corpus_scores returns, got {type(scores).__name__}")
    missing = [k for k in ("bleu", "bleu_signature", "chrf", "chrf_signature") if k not in scores]
    if missing:
        raise ValueError(f"scores: not a corpus_scores result (missing {', '.join(missing)})")
    return (f"BLEU = {scores['bleu']:.2f} ({scores['bleu_signature']}) | "
            f"chrF = {scores['chrf']:.2f} ({scores['chrf_signature']})")
