"""Translation of parallel text with ConvS2S (Multi30k de->en in the recipes).

    parallel.py    reading, tokenising (SentencePiece subwords or spaCy words: ``TextCodec``), numericalising
                   and batching parallel text
    bleu.py        sacreBLEU and chrF on detokenized text (``corpus_scores``) and the tutorial's tokenized BLEU
    task.py        ``MTTask`` for ``fastqa.train.fit``; ``train_translation`` from files
    translator.py  ``Translator``: a trained model translating text (greedy, beam search, n-best, attention maps)
    cli.py         ``fastqa mt-train | translate | mt-eval``
    spec.py        ``SPEC``: the task as the command line, the server, the shipped models and the trainer see it
    serving.py     ``POST /translate`` of ``fastqa serve``: its schemas and how a batch of requests is answered

Heavy modules load on first use, so ``fastqa --help`` does not import the models.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Translator": "translator", "Translation": "translator", "AttentionMap": "translator",
            "MTOptions": "task", "MTTask": "task", "build_task": "task", "train_translation": "task",
            "read_parallel": "parallel", "TextCodec": "parallel", "corpus_scores": "bleu", "format_scores": "bleu",
            "tokenized_bleu": "bleu"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
