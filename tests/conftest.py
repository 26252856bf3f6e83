"""Test set-up: Triton kernels run in the interpreter on CPU tensors when there is no GPU.

TRITON_INTERPRET must be set before triton.jit decorates the kernels, so it is set here, before any
fastqa import.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.backends.cudnn.deterministic = True
