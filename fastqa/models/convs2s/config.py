"""ConvS2SConfig: the hyper-parameters of a convolutional sequence-to-sequence model, with named presets.

Presets (vocabulary sizes always come from the data, so they are passed as overrides):

- ``tutorial``: the Multi30k tutorial's model -- embedding 256, hidden 512, 10 encoder + 10 decoder
  layers, kernel 3, dropout 0.25 (about 40M parameters with the Multi30k vocabularies: the tutorial's
  37M plus the per-layer attention projections of Gehring et al., which its decoder shared).
- ``small``: sized for training on a 2-core CPU in about an hour -- embedding 256, hidden 256,
  5 encoder + 5 decoder layers, kernel 3 (an encoder position sees 11 source tokens, a decoder position
  the 10 target tokens before it, and attention the whole source), dropout 0.2
  (about 10M parameters with the Multi30k vocabularies, 5M of them in the embeddings and output layer).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ModelConfig

__all__ = ["ConvS2SConfig", "LAYERS", "PRESETS"]

LAYERS = ("fast", "reference")

PRESETS: dict[str, dict[str, Any]] = {
    "tutorial": dict(embed_dim=256, hidden_dim=512, encoder_layers=10, decoder_layers=10, kernel_size=3,
                     dropout=0.25),
    "small": dict(embed_dim=256, hidden_dim=256, encoder_layers=5, decoder_layers=5, kernel_size=3,
                  dropout=0.2),
}


@dataclass
class ConvS2SConfig(ModelConfig):
    """Hyper-parameters of :class:`~fastqa.models.convs2s.ConvS2S`.

    src_vocab_size / tgt_vocab_size: vocabulary sizes; pad/unk/sos/eos ids are the same in both
    vocabularies (``<pad> <unk> <sos> <eos>`` first). embed_dim: token/position embedding and attention
    width; hidden_dim: convolution channels; kernel_size: odd (the encoder's convolutions are centred).
    max_positions: longest source or target (with sos/eos) the learned positions cover.
    layers: "fast" (fastqa.layers, fused kernels) or "reference" (fastqa.reference, pure PyTorch).
    """
    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int = 0
    unk_id: int = 1
    sos_id: int = 2
    eos_id: int = 3
    embed_dim: int = 256
    hidden_dim: int = 512
    encoder_layers: int = 10
    decoder_layers: int = 10
    kernel_size: int = 3
    dropout: float = 0.25
    max_positions: int = 256
    layers: str = "fast"

    PRESETS = PRESETS
    REQUIRED = ("src_vocab_size", "tgt_vocab_size")
    MODEL = "ConvS2S"

    def __post_init__(self) -> None:
        for name in ("embed_dim", "hidden_dim", "encoder_layers", "decoder_layers", "kernel_size", "max_positions"):
            self._check_int(name, 1)
        self._check_special_ids(("pad_id", "unk_id", "sos_id", "eos_id"), ("src_vocab_size", "tgt_vocab_size"))
        if self.kernel_size % 2 == 0:
            raise ValueError(f"ConvS2SConfig.kernel_size must be odd (centred encoder convolutions), "
                             f"got {self.kernel_size}")
        self._check_prob("dropout")
        self._check_choice("layers", LAYERS)
