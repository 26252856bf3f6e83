"""Pure-PyTorch references: the ground truth every kernel is tested against, and the fallback backend."""
from .context_query_attention import (
    ContextQueryAttention,
    TrilinearSimilarity,
    context_query_attention,
    context_query_attention_naive,
    masked_softmax,
    trilinear_similarity,
    trilinear_similarity_naive,
)
from .decode_attention import DecodeAttention, decode_attention
from .dropout_add import DropoutAdd, draw_device_seed, draw_seed, dropout_add
from .dwsep_conv1d import (
    DepthwiseSeparableConv1d,
    LayerNormDepthwiseSeparableConv1d,
    conv_padding,
    dwsep_conv1d,
    ln_dwsep_conv1d,
)
from .glu_conv1d import GLUConv1d, glu_conv1d, glu_conv1d_naive, glu_conv1d_step
from .linear import Linear, linear, linear_argmax
from .self_attention import SelfAttention, check_segments, self_attention

__all__ = [
    "ContextQueryAttention", "DecodeAttention", "DropoutAdd", "DepthwiseSeparableConv1d", "GLUConv1d", "LayerNormDepthwiseSeparableConv1d", "Linear",
    "SelfAttention", "TrilinearSimilarity", "check_segments",
    "context_query_attention", "context_query_attention_naive", "conv_padding", "decode_attention", "draw_device_seed", "draw_seed", "dropout_add", "dwsep_conv1d",
    "glu_conv1d", "glu_conv1d_naive", "glu_conv1d_step", "linear", "linear_argmax", "ln_dwsep_conv1d", "masked_softmax", "self_attention", "trilinear_similarity",
    "trilinear_similarity_naive",
]
