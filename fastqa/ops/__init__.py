"""Functional ops: argument checks, backend dispatch and the autograd Functions.

Where Triton can run here (a CUDA device, or ``TRITON_INTERPRET=1``), its kernels are imported now,
so their custom ops are registered before any ``torch.compile`` trace reaches them.
"""
from .._backend import triton_usable_here
from .context_query_attention import context_query_attention, trilinear_similarity
from .decode_attention import decode_attention
from .dropout_add import dropout_add
from .dwsep_conv1d import dwsep_conv1d, ln_dwsep_conv1d
from .glu_conv1d import glu_conv1d, glu_conv1d_step
from .linear import linear, linear_argmax
from .self_attention import self_attention

if triton_usable_here():
    from .. import triton_kernels  # noqa: F401  (registers torch.ops.fastqa_triton.*)
    from ._registry import register_triton_autograd

    register_triton_autograd()

__all__ = [
    "context_query_attention", "decode_attention", "dropout_add", "dwsep_conv1d", "glu_conv1d", "glu_conv1d_step", "linear", "linear_argmax", "ln_dwsep_conv1d",
    "self_attention", "trilinear_similarity",
]
