"""fastqa: fused kernels for depthwise-separable conv1d, context-query attention and GLU convolution.

Functional ops live in ``fastqa.ops`` (re-exported here), drop-in modules in ``fastqa.layers``,
the pure-PyTorch references in ``fastqa.reference``. ``fastqa.info()`` says which backends are usable.
"""
__version__ = "0.1.0"

from ._backend import BACKENDS, info  # noqa: E402

__all__ = ["BACKENDS", "info", "__version__"]

# glu_conv1d
from . import layers, ops, reference  # noqa: E402,F401
from .ops import glu_conv1d, glu_conv1d_step  # noqa: E402,F401

__all__ += ["glu_conv1d", "glu_conv1d_step"]
