"""LSTMReaderConfig: the attention tutorial's three recurrent QA baselines, with named presets.

Variants (``variant``):

- ``lstm``: a 2-layer LSTM reads [question; <SEP>; context]; its last state, through an output layer tied to
  the word embedding, scores vocabulary words; the answer is the best-scoring word that occurs in the context.
- ``lstm-attention``: the same, with an attention summary of all states (query: the last state) beside the
  last state before the output layer.
- ``lstm-pointer``: attention logits (query: the last state) over the context positions are the answer
  distribution; with ``pointer_span`` a start and an end pointer answer spans, without it a single word.

Presets (the vocabulary size always comes from the data, so it is passed as an override):

- ``small``: 50-d words (GloVe 6B 50d), hidden 128, 2 layers, dropout 0.2 -- a CPU-sized baseline beside
  the ``small`` QANet.
- ``base``: 300-d words, hidden 256, 2 layers, dropout 0.3.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ModelConfig

__all__ = ["LSTMReaderConfig", "PRESETS", "VARIANTS"]

VARIANTS = ("lstm", "lstm-attention", "lstm-pointer")

PRESETS: dict[str, dict[str, Any]] = {
    "small": dict(word_dim=50, hidden_dim=128, num_layers=2, dropout=0.2),
    "base": dict(word_dim=300, hidden_dim=256, num_layers=2, dropout=0.3),
}


@dataclass
class LSTMReaderConfig(ModelConfig):
    """Hyper-parameters of :class:`~fastqa.models.lstm_readers.LSTMReader`.

    variant: one of ``VARIANTS`` (see the module docstring). word_vocab_size / pad_id / unk_id: the word
    vocabulary (frozen word vectors with a trainable <unk>; <SEP> is a learned vector of its own, not a
    vocabulary entry). hidden_dim / num_layers: the LSTM. dropout: on the embeddings, between LSTM layers
    and on the output features. pointer_span: ``lstm-pointer`` answers spans (start and end pointers)
    instead of single words. no_answer: SQuAD v2.0 -- a learned null score (index 0) in the answer
    distributions.
    """
    variant: str
    word_vocab_size: int
    pad_id: int = 0
    unk_id: int = 1
    word_dim: int = 50
    hidden_dim: int = 128
    num_layers: int = 2
    dropout: float = 0.2
    pointer_span: bool = True
    no_answer: bool = False

    PRESETS = PRESETS
    REQUIRED = ("variant", "word_vocab_size")
    MODEL = "LSTM reader"

    def __post_init__(self) -> None:
        self._check_choice("variant", VARIANTS)
        self._check_special_ids(("pad_id", "unk_id"), ("word_vocab_size",))
        for name in ("word_dim", "hidden_dim", "num_layers"):
            self._check_int(name, 1)
        self._check_prob("dropout")
        self._check_bool("pointer_span")
        self._check_bool("no_answer")

    @property
    def scores_vocabulary(self) -> bool:
        """The answer is a vocabulary word scored by the tied output layer (``lstm``, ``lstm-attention``)."""
        return self.variant != "lstm-pointer"

    @property
    def single_word(self) -> bool:
        """The model answers one word (its end distribution is "the start"; decoding takes spans of 1 token)."""
        return self.scores_vocabulary or not self.pointer_span
