"""fastqa: fused kernels for depthwise-separable conv1d, context-query attention and GLU convolution.

Functional ops live in ``fastqa.ops`` (re-exported here), drop-in modules in ``fastqa.layers``,
the pure-PyTorch references in ``fastqa.reference``. ``fastqa.info()`` says which backends are usable.
"""
from ._version import __version__  # noqa: E402

from . import layers, ops, reference  # noqa: E402
from ._backend import BACKENDS, info  # noqa: E402
from .ops import (  # noqa: E402
    context_query_attention,
    decode_attention,
    dropout_add,
    dwsep_conv1d,
    glu_conv1d,
    glu_conv1d_step,
    linear,
    linear_argmax,
    ln_dwsep_conv1d,
    self_attention,
    trilinear_similarity,
)

__all__ = [
    "BACKENDS", "info", "__version__", "layers", "ops", "reference",
    "context_query_attention", "decode_attention", "dropout_add", "dwsep_conv1d", "glu_conv1d", "glu_conv1d_step", "linear", "linear_argmax", "ln_dwsep_conv1d",
    "self_attention", "trilinear_similarity",
]
