"""QANetConfig: the hyper-parameters of QANet (Yu et al. 2018), with named presets.

Presets (vocabulary sizes always come from the data, so they are passed as overrides):

- ``paper``: the paper's model -- 300-d frozen word vectors, 200-d character embeddings and a 200-channel
  character convolution (kernel 5), d_model 128, 8 heads, 1 embedding-encoder block of 4 convolutions
  (kernel 7), 7 model-encoder blocks of 2 convolutions (kernel 5) applied 3 times with shared weights,
  dropout 0.1 (0.05 on the characters), stochastic depth down to 0.9 survival.
- ``small``: sized to train visibly on a 2-core CPU within an hour with GloVe 50-d vectors -- 50-d words,
  32-d characters with a 64-channel conv, d_model 64, 4 heads, 1 embedding-encoder block of 2 convolutions
  (kernel 7), 3 model-encoder blocks of 2 convolutions (kernel 5) applied 3 times, the same dropouts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["LAYERS", "PRESETS", "QANetConfig"]

LAYERS = ("fast", "reference", "naive")

PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(word_dim=300, char_dim=200, char_channels=200, char_kernel=5, d_model=128, heads=8,
                  emb_conv_layers=4, emb_conv_kernel=7, model_blocks=7, model_conv_layers=2,
                  model_conv_kernel=5, model_passes=3, dropout=0.1, char_dropout=0.05, layer_dropout=0.1),
    "small": dict(word_dim=50, char_dim=32, char_channels=64, char_kernel=5, d_model=64, heads=4,
                  emb_conv_layers=2, emb_conv_kernel=7, model_blocks=3, model_conv_layers=2,
                  model_conv_kernel=5, model_passes=3, dropout=0.1, char_dropout=0.05, layer_dropout=0.1),
}


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"QANetConfig.{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"QANetConfig.{name} must be >= {minimum}, got {value}")


def _check_prob(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"QANetConfig.{name} must be a float, got {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"QANetConfig.{name} must be in [0, 1), got {value}")
    return float(value)


@dataclass
class QANetConfig:
    """Hyper-parameters of :class:`~fastqa.models.qanet.QANet`.

    word_vocab_size / char_vocab_size: vocabulary sizes (``pad_id`` and ``unk_id`` are the same in both).
    word_dim: the frozen word vectors' width; char_dim: character embedding width; char_channels /
    char_kernel: the per-word character convolution (its max over the word's characters is the word's
    character vector). d_model / heads: encoder width and self-attention heads (d_model % heads == 0).
    emb_conv_layers / emb_conv_kernel: the embedding-encoder block (shared by context and question);
    model_blocks, model_conv_layers / model_conv_kernel: the model-encoder stack, applied model_passes (= 3:
    M0, M1, M2) times with shared weights. dropout: on word vectors and every sublayer output; char_dropout: on the
    character embeddings; layer_dropout: stochastic depth, sublayer l of L survives with probability
    1 - (l / L) * layer_dropout in training. emb_resize_kernel: kernel of the depthwise-separable conv that
    resizes [word; char] to d_model. max_word_len: characters kept per word by the data pipeline.
    no_answer: SQuAD v2.0 -- a learned null score (index 0) in the start and end distributions.
    layers: "fast" (fastqa.layers, fused kernels), "reference" (fastqa.reference, pure PyTorch) or
    "naive" (reference, with the tutorials' [B, n, m, 3d] trilinear); all three share parameter names.
    """
    word_vocab_size: int
    char_vocab_size: int
    pad_id: int = 0
    unk_id: int = 1
    word_dim: int = 300
    char_dim: int = 200
    char_channels: int = 200
    char_kernel: int = 5
    d_model: int = 128
    heads: int = 8
    emb_resize_kernel: int = 5
    emb_conv_layers: int = 4
    emb_conv_kernel: int = 7
    model_blocks: int = 7
    model_conv_layers: int = 2
    model_conv_kernel: int = 5
    model_passes: int = 3
    dropout: float = 0.1
    char_dropout: float = 0.05
    layer_dropout: float = 0.1
    max_word_len: int = 16
    no_answer: bool = False
    layers: str = "fast"

    def __post_init__(self) -> None:
        for name in ("pad_id", "unk_id"):
            _check_int(name, getattr(self, name), 0)
        if self.pad_id == self.unk_id:
            raise ValueError(f"QANetConfig.pad_id and unk_id must differ, both are {self.pad_id}")
        for name in ("word_vocab_size", "char_vocab_size"):
            _check_int(name, getattr(self, name), max(self.pad_id, self.unk_id) + 1)
        for name in ("word_dim", "char_dim", "char_channels", "char_kernel", "d_model", "heads",
                     "emb_resize_kernel", "emb_conv_layers", "emb_conv_kernel", "model_blocks",
                     "model_conv_layers", "model_conv_kernel", "model_passes", "max_word_len"):
            _check_int(name, getattr(self, name), 1)
        if self.model_passes != 3:
            raise ValueError(f"QANetConfig.model_passes must be 3 (the heads read M0, M1, M2), got {self.model_passes}")
        if self.d_model % self.heads:
            raise ValueError(f"QANetConfig.d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        for name in ("char_kernel", "emb_resize_kernel", "emb_conv_kernel", "model_conv_kernel"):
            if getattr(self, name) % 2 == 0:
                raise ValueError(f"QANetConfig.{name} must be odd (centred convolutions), got {getattr(self, name)}")
        for name in ("dropout", "char_dropout", "layer_dropout"):
            setattr(self, name, _check_prob(name, getattr(self, name)))
        if not isinstance(self.no_answer, bool):
            raise TypeError(f"QANetConfig.no_answer must be a bool, got {type(self.no_answer).__name__}")
        if self.layers not in LAYERS:
            raise ValueError(f"QANetConfig.layers must be one of {LAYERS}, got {self.layers!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "QANetConfig":
        """The preset ``name`` ("paper" or "small") with ``overrides`` (at least the vocabulary sizes)."""
        if name not in PRESETS:
            raise ValueError(f"unknown QANet preset {name!r}; known: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; ``from_dict`` rebuilds the same config."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QANetConfig":
        """Inverse of ``to_dict``; unknown keys and missing vocabulary sizes raise ValueError naming them."""
        if not isinstance(d, dict):
            raise TypeError(f"QANetConfig.from_dict takes a dict, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"unknown QANetConfig field(s): {', '.join(unknown)}")
        missing = [k for k in ("word_vocab_size", "char_vocab_size") if k not in d]
        if missing:
            raise ValueError(f"QANetConfig needs {', '.join(missing)}")
        return cls(**d)
