"""The one tolerance table, without torch: (atol, rtol) per comparison and dtype, the dtypes by their torch
names. ``tests/helpers.py`` reads it (as ``TOLERANCES``, keyed by ``torch.dtype``) and so does the GPU check
(``scripts/gpu_check/common.py``, whose supervisor runs where torch cannot be imported and loads this file by
its path). Standard library only, and nothing but the table.

The comparisons:
- "same dtype": a kernel against the reference computed in the same dtype (``assert_close``'s default).
- "vs fp32": a 16-bit kernel against the fp32 reference run on the same (rounded) inputs: the kernel's own
  rounding of intermediates adds to the dtype's.
- "vs float64": a kernel in a dtype against the float64 reference, atol relative to the largest reference
  magnitude (weight gradients are sums over B * L rows).
- "scaled": |got - want| <= atol * max(1, max |want|) + rtol * |want| (attention outputs; one number, atol = rtol).
- "gpu model shapes": model-sized shapes on a GPU against float64, max |diff| <= atol * max(1, max |want|) (no rtol).
- "gpu check": the GPU check's op phase, max |got - ref| / max |ref| <= atol per tensor (no rtol), ref = the
  float64 reference on the same (rounded) inputs. fp32 kernels accumulate in fp32 (Triton dots in tf32x3): far
  under it; bf16 rounds every stored intermediate to 8 mantissa bits.
"""
from __future__ import annotations

TABLE: dict[str, dict[str, tuple[float, float]]] = {
    "same dtype": {
        "float64": (1e-10, 1e-8),
        "float32": (2e-4, 2e-4),
        "float16": (5e-3, 5e-3),
        "bfloat16": (5e-2, 2e-2),
    },
    "vs fp32": {"float16": (1e-2, 1e-2), "bfloat16": (6e-2, 3e-2)},
    "vs float64": {
        "float64": (1e-10, 1e-8),
        "float32": (1e-5, 1e-4),
        "float16": (4e-3, 1e-2),
        "bfloat16": (3e-2, 3e-2),
    },
    "scaled": {"float32": (2e-4, 2e-4), "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)},
    "gpu model shapes": {"float32": (5e-3, 0.0), "float16": (1e-2, 0.0), "bfloat16": (4e-2, 0.0)},
    "gpu check": {"float32": (1e-4, 0.0), "bfloat16": (2e-2, 0.0)},
}
