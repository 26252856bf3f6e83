"""Tokenisation with spaCy's rule-based tokenizers (``spacy.blank(lang)``: no model download), and
detokenisation of model output with sacremoses' Moses detokenizer.

Tokens keep their character offsets into the original text, so a span of tokens maps back to the exact
characters a user gave (SQuAD answers are sliced from the original context, never re-joined tokens).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

__all__ = ["tokenize", "get_tokenizer", "detokenize"]


@functools.lru_cache(maxsize=None)
def get_tokenizer(lang: str = "en") -> Callable:
    """spaCy's rule-based tokenizer for ``lang`` (e.g. "en", "de"), built once per process."""
    try:
        import spacy
    except ImportError as e:  # pragma: no cover - the `models` extra installs it
        raise ImportError("fastqa's data pipeline needs spaCy: pip install 'fastqa[models]'") from e
    try:
        return spacy.blank(lang).tokenizer
    except Exception as e:  # spaCy raises its own error types for unknown languages
        raise ValueError(f"lang: spaCy has no tokenizer for language {lang!r} ({e})") from e


def tokenize(text: str, lang: str = "en") -> list[tuple[str, int]]:
    """``text`` -> [(token, start char offset)]; whitespace-only tokens are dropped.

    The end offset of a token is ``start + len(token)``: spaCy tokens are exact substrings of ``text``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return [(t.text, t.idx) for t in get_tokenizer(lang)(text) if not t.is_space]


@functools.lru_cache(maxsize=None)
def _detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def detokenize(tokens: Sequence[str], lang: str = "en") -> str:
    """Model tokens -> text (``["a", "dog", ",", "running", "."]`` -> ``"a dog, running."``)."""
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of tokens, not a str")
    if not tokens:
        return ""
    return _detokenizer(lang).detokenize(list(tokens))
