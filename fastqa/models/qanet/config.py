"""QANetConfig: the hyper-parameters of QANet (Yu et al. 2018), with named presets.

Presets (vocabulary sizes always come from the data, so they are passed as overrides):

- ``paper``: the paper's model -- 300-d frozen word vectors, 200-d character embeddings and a 200-channel
  character convolution (kernel 5), d_model 128, 8 heads, 1 embedding-encoder block of 4 convolutions
  (kernel 7), 7 model-encoder blocks of 2 convolutions (kernel 5) applied 3 times with shared weights,
  dropout 0.1 (0.05 on the characters), stochastic depth down to 0.9 survival.
- ``small``: sized to train visibly on a 2-core CPU within an hour with GloVe 50-d vectors -- 50-d words,
  32-d characters with a 64-channel conv, d_model 64, 4 heads, 1 embedding-encoder block of 2 convolutions
  (kernel 7), 3 model-encoder blocks of 2 convolutions (kernel 5) applied 3 times, the same dropouts, and
  the exact-match channel (``word_match``; not in the paper): trained on 40 SQuAD articles for 90 minutes
  it reached dev F1 50.8, where the same model without it levelled off at 29.5
  (``docs/runs/qanet-small-v11-match``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ModelConfig

__all__ = ["LAYERS", "PRESETS", "QANetConfig"]

LAYERS = ("fast", "reference", "naive")

PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(word_dim=300, char_dim=200, char_channels=200, char_kernel=5, d_model=128, heads=8,
                  emb_conv_layers=4, emb_conv_kernel=7, model_blocks=7, model_conv_layers=2,
                  model_conv_kernel=5, model_passes=3, dropout=0.1, char_dropout=0.05, layer_dropout=0.1),
    "small": dict(word_dim=50, char_dim=32, char_channels=64, char_kernel=5, d_model=64, heads=4,
                  emb_conv_layers=2, emb_conv_kernel=7, model_blocks=3, model_conv_layers=2,
                  model_conv_kernel=5, model_passes=3, dropout=0.1, char_dropout=0.05, layer_dropout=0.1,
                  word_match=True),
}


@dataclass
class QANetConfig(ModelConfig):
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
    word_match: not in the QANet paper (off in ``paper``, on in ``small``) -- DrQA's exact-match feature (Chen et al. 2017):
    each word's input gets one more channel, 1 when the same word (same vocabulary id, neither <pad> nor
    <unk>) occurs in the other text (a context word in the question, a question word in the context), for
    readers trained on little data that must learn to find the question's words.
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
    word_match: bool = False
    layers: str = "fast"

    PRESETS = PRESETS
    REQUIRED = ("word_vocab_size", "char_vocab_size")
    MODEL = "QANet"

    def __post_init__(self) -> None:
        self._check_special_ids(("pad_id", "unk_id"), ("word_vocab_size", "char_vocab_size"))
        for name in ("word_dim", "char_dim", "char_channels", "char_kernel", "d_model", "heads",
                     "emb_resize_kernel", "emb_conv_layers", "emb_conv_kernel", "model_blocks",
                     "model_conv_layers", "model_conv_kernel", "model_passes", "max_word_len"):
            self._check_int(name, 1)
        if self.model_passes != 3:
            raise ValueError(f"QANetConfig.model_passes must be 3 (the heads read M0, M1, M2), got {self.model_passes}")
        if self.d_model % self.heads:
            raise ValueError(f"QANetConfig.d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        for name in ("char_kernel", "emb_resize_kernel", "emb_conv_kernel", "model_conv_kernel"):
            if getattr(self, name) % 2 == 0:
                raise ValueError(f"QANetConfig.{name} must be odd (centred convolutions), got {getattr(self, name)}")
        for name in ("dropout", "char_dropout", "layer_dropout"):
            self._check_prob(name)
        self._check_bool("no_answer")
        self._check_bool("word_match")
        self._check_choice("layers", LAYERS)

    @property
    def single_word(self) -> bool:
        """QANet answers spans (the QA pipeline asks every reader's config)."""
        return False
