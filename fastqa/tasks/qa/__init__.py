"""Extractive question answering on SQuAD v1.1/v2.0 with QANet or the recurrent baselines.

    squad.py      reading, tokenising, encoding and batching SQuAD (with a preprocessed-data cache)
    encoding.py   tokens to word and character ids, a (context, question) pair encoded, padding
    metric.py     the official EM/F1 (v1.1 and v2.0 semantics)
    readers.py    the readers a run can train (``MODELS``) and how each is built from its config
    spans.py      span decoding: the k best spans by p1(i)·p2(j) over i <= j <= i + max_answer_len
    inference.py  the reader's inference: contexts of any length in overlapping windows of tokens, batched,
                  their best spans merged and ranked
    task.py       ``QATask`` for ``fastqa.train.fit`` and prediction over a SQuAD set
    predictor.py  ``QAModel``: a trained reader answering questions, each ``Answer`` typed
    calibration.py  scores that estimate the probability of being right (Platt scaling)
    cli.py        ``fastqa qa-train | qa-predict | qa-eval | qa-calibrate | ask``
    spec.py       ``SPEC``: the task as the command line, the server, the shipped models and the trainer see it
    serving.py    ``POST /answer`` of ``fastqa serve``: its schemas and how a batch of requests is answered

Heavy modules load on first use, so ``fastqa --help`` does not import the models.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"QAModel": "predictor", "Answer": "predictor", "Calibration": "calibration", "QATask": "task", "Recipe": "task", "PredictOutput": "task", "predict": "task",
            "span_loss": "task", "score_predictions": "task", "decode_top_spans": "spans",
            "MODELS": "readers", "load_squad": "squad", "Limits": "squad", "evaluate": "metric"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
