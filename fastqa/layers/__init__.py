"""Drop-in modules: same parameters and state_dict keys as their twins in ``fastqa.reference``."""
from .context_query_attention import ContextQueryAttention, TrilinearSimilarity
from .decode_attention import DecodeAttention
from .dropout_add import DropoutAdd
from .dwsep_conv1d import DepthwiseSeparableConv1d, LayerNormDepthwiseSeparableConv1d
from .glu_conv1d import GLUConv1d
from .linear import Linear
from .self_attention import SelfAttention

__all__ = [
    "ContextQueryAttention", "DecodeAttention", "DropoutAdd", "DepthwiseSeparableConv1d", "GLUConv1d", "LayerNormDepthwiseSeparableConv1d", "Linear",
    "SelfAttention", "TrilinearSimilarity",
]
