"""A model's argument checks: its constructor's (``check_config``) and a QA model's inputs (``check_qa_inputs``)."""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["check_config", "check_qa_inputs"]


def check_config(model: str, config: object, config_type: type, layers: str | None = None,
                 choices: Sequence[str] = ()) -> str | None:
    """A model constructor's argument checks: ``config`` is a ``config_type``; ``layers`` (None: the config's)
    is one of ``choices``. Returns the layer backend to use (None for a model without one)."""
    if not isinstance(config, config_type):
        raise TypeError(f"{model}: config must be a {config_type.__name__}, got {type(config).__name__}")
    if not choices:
        return None
    layers = getattr(config, "layers") if layers is None else layers
    if layers not in choices:
        raise ValueError(f"{model}: layers must be one of {tuple(choices)}, got {layers!r}")
    return layers


def _check_ids(model: str, name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{model}.forward: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.long:
        raise TypeError(f"{model}.forward: {name} must be int64 (torch.long) ids, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{model}.forward: {name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if 0 in t.shape:
        raise ValueError(f"{model}.forward: {name} must have a non-zero size in every dimension, got shape "
                         f"{tuple(t.shape)}")
    return t


def check_qa_inputs(model: str, context_words: object, context_chars: object, question_words: object,
                    question_chars: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checks of a QA model's inputs: context_words [B, n], context_chars [B, n, W], question_words [B, m],
    question_chars [B, m, W'], all int64, no size 0 (an empty batch, text or word: nothing to read). Returns them.
    A model that passes them may run its layers under ``fastqa._checks.arguments_checked``."""
    cw, cc = _check_ids(model, "context_words", context_words, 2), _check_ids(model, "context_chars", context_chars, 3)
    qw, qc = _check_ids(model, "question_words", question_words, 2), _check_ids(model, "question_chars", question_chars, 3)
    if cc.shape[:2] != cw.shape:
        raise ValueError(f"{model}.forward: context_chars {tuple(cc.shape)} must be [B, n, W] with "
                         f"[B, n] = context_words' shape {tuple(cw.shape)}")
    if qc.shape[:2] != qw.shape:
        raise ValueError(f"{model}.forward: question_chars {tuple(qc.shape)} must be [B, m, W] with "
                         f"[B, m] = question_words' shape {tuple(qw.shape)}")
    if qw.shape[0] != cw.shape[0]:
        raise ValueError(f"{model}.forward: question batch {qw.shape[0]} != context batch {cw.shape[0]}")
    return cw, cc, qw, qc

