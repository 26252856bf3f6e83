"""Triton kernels of fastqa (shipped as ``fastqa.triton_kernels``): importing a module registers its
``torch.ops.fastqa_triton.*`` custom ops. Needs triton; runs on CUDA tensors, or on CPU tensors
under ``TRITON_INTERPRET=1``."""
from . import context_query_attention, dropout_add, dwsep_conv1d, glu_conv1d  # noqa: F401
