"""The readers a QA run can train (``MODELS``): QANet and the recurrent baselines, built from a config.

Every reader takes the same batch and returns start/end log-probabilities over the context positions, so one
task, one decoder, one metric and one checkpoint format serve them all; a checkpoint's ``kind`` is the
reader's name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import UserError

if TYPE_CHECKING:  # the command line reads MODELS without importing torch
    from torch import nn

    from ...data.vocab import Vocab
    from .squad import Limits

__all__ = ["MODELS", "answer_len", "config_type", "build_model", "model_kind", "meta_config", "make_config"]


MODELS = ("qanet", "lstm", "lstm-attention", "lstm-pointer")


def answer_len(config: Any, max_answer_len: int) -> int:
    """The longest answer (last - first token) a reader can give: 0 for a single-word reader."""
    return 0 if config.single_word else max_answer_len


def config_type(kind: str) -> type:
    from ...models.lstm_readers import LSTMReaderConfig
    from ...models.qanet import QANetConfig

    return QANetConfig if kind == "qanet" else LSTMReaderConfig


def build_model(config: Any) -> nn.Module:
    from ...models.lstm_readers import LSTMReader, LSTMReaderConfig
    from ...models.qanet import QANet

    return LSTMReader(config) if isinstance(config, LSTMReaderConfig) else QANet(config)


def model_kind(config: Any) -> str:
    """The reader's name (one of ``MODELS``), which is also its checkpoints' ``kind``."""
    return getattr(config, "variant", "qanet")


def meta_config(config: Any) -> dict:
    # The layer backend is not part of a model's identity: one state_dict serves all three.
    d = config.to_dict()
    d.pop("layers", None)
    return d


def make_config(model: str, preset: str, words: Vocab, chars: Vocab, limits: Limits, no_answer: bool,
                 fields: dict) -> Any:
    """The reader's config: the preset, the vocabularies' sizes and ids, and ``fields`` over them."""
    common = dict(word_vocab_size=len(words), pad_id=words.pad_id, unk_id=words.unk_id, no_answer=no_answer)
    if model == "qanet":
        common.update(char_vocab_size=len(chars), max_word_len=limits.chars)
    else:
        common.update(variant=model)
    try:
        return config_type(model).from_preset(preset, **common, **fields)
    except (TypeError, ValueError) as e:
        raise UserError(f"model config: {e}") from None
