"""torch.autocast is respected: inside a region, every op runs in the autocast dtype, as nn.Conv1d would."""
import pytest
import torch

import fastqa
from helpers import assert_close, compiled_backends

# On CPU, autocast's bfloat16 runs on the reference backend (the C++ kernels are fp32/fp64) and, under
# the Triton interpreter, on the Triton kernels.
BACKENDS = ["reference"] + [b for b in compiled_backends() if b == "triton"]


def _cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 8, generator=g)
    dw, pw, pb = torch.randn(8, 1, 3, generator=g), torch.randn(6, 8, 1, generator=g), torch.randn(6, generator=g)
    yield "dwsep_conv1d", lambda **kw: fastqa.dwsep_conv1d(x, dw, pw, pb, activation="relu", **kw)
    c, q = torch.randn(2, 7, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    masks = torch.ones(2, 7, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    w = torch.randn(12, generator=g)
    yield "context_query_attention", lambda **kw: fastqa.context_query_attention(c, q, *masks, w, **kw)
    glu_w, glu_b = torch.randn(16, 8, 3, generator=g) * 0.2, torch.randn(16, generator=g)
    yield "glu_conv1d", lambda **kw: fastqa.glu_conv1d(x, glu_w, glu_b, causal=True, **kw)
    yield "glu_conv1d_step", lambda **kw: fastqa.glu_conv1d_step(x[:, 0], x[:, :2], glu_w, glu_b, **kw)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, call", list(_cases()), ids=[name for name, _ in _cases()])
def test_autocast_runs_ops_in_the_autocast_dtype(name, call, backend):
    want = call(backend="reference")  # float32, outside autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = call(backend=backend)
    assert got.dtype == torch.bfloat16, f"{name}: autocast ignored"
    assert_close(got.float(), want, name=name, atol=0.15, rtol=0.05)
