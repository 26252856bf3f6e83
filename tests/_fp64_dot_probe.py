"""One tiny float64 ``tl.dot`` (``helpers.fp64_dot_skip_reason``): Triton kernels must live in a file."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    a = tl.load(a_ptr + offs[:, None] * N + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * N + offs[None, :])
    tl.store(c_ptr + offs[:, None] * N + offs[None, :], tl.dot(a, b, input_precision="ieee"))


def probe() -> str | None:
    """None when a [16, 16] float64 dot compiles and gives torch's product, else why not."""
    a = torch.randn(16, 16, dtype=torch.float64, device="cuda")
    b = torch.randn(16, 16, dtype=torch.float64, device="cuda")
    c = torch.empty_like(a)
    _dot_kernel[(1,)](a, b, c, N=16)
    if not torch.allclose(c, a @ b, rtol=1e-12, atol=1e-12):
        return "a float64 tl.dot compiles but gives wrong products on this GPU"
    return None
