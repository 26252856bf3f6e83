"""torch.autocast is respected: inside a region, every op runs in the autocast dtype, as nn.Conv1d would."""
import pytest
import torch

import fastqa
from helpers import assert_close, compiled_backends, device_of

# The same casting rule on every device: under torch.autocast("cpu") bfloat16 runs on the C++ kernels (and,
# under the Triton interpreter, on the Triton kernels); on a GPU the Triton backend takes CUDA tensors under
# torch.autocast("cuda").
BACKENDS = ["reference"] + compiled_backends()


def _cases(device: torch.device):
    g = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    x = randn(2, 9, 8)
    dw, pw, pb = randn(8, 1, 3), randn(6, 8, 1), randn(6)
    yield "dwsep_conv1d", lambda **kw: fastqa.dwsep_conv1d(x, dw, pw, pb, activation="relu", **kw)
    c, q = randn(2, 7, 4), randn(2, 5, 4)
    masks = torch.ones(2, 7, dtype=torch.bool, device=device), torch.ones(2, 5, dtype=torch.bool, device=device)
    w = randn(12)
    yield "context_query_attention", lambda **kw: fastqa.context_query_attention(c, q, *masks, w, **kw)
    glu_w, glu_b = randn(16, 8, 3, scale=0.2), randn(16)
    yield "glu_conv1d", lambda **kw: fastqa.glu_conv1d(x, glu_w, glu_b, causal=True, **kw)
    yield "glu_conv1d_step", lambda **kw: fastqa.glu_conv1d_step(x[:, 0], x[:, :2], glu_w, glu_b, **kw)[0]


CASE_NAMES = [name for name, _ in _cases(torch.device("cpu"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_autocast_runs_ops_in_the_autocast_dtype(name, backend):
    _check_under_autocast(name, device_of(backend), backend)


def _check_under_autocast(name: str, device: torch.device, backend: str) -> None:
    """The op ``name`` under bf16 autocast on ``backend``: a bf16 result close to the float32 reference's."""
    call = dict(_cases(device))[name]
    want = call(backend="reference")  # float32, outside autocast
    with torch.autocast(device.type, dtype=torch.bfloat16):
        got = call(backend=backend)
    assert got.dtype == torch.bfloat16, f"{name}: autocast ignored"
    assert got.device == want.device
    assert_close(got.float(), want, name=name, atol=0.15, rtol=0.05)


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_each_cpu_bf16_route_runs_under_autocast(monkeypatch, name, route):
    """Under torch.autocast the C++ kernels' own ATen calls run in the dtypes the kernel gives them: a widening
    route's float32 products are not cast to bf16 again by autocast (which stays on for the caller's thread)."""
    if "cpu" not in BACKENDS:
        pytest.skip("needs the C++ extension")
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    _check_under_autocast(name, torch.device("cpu"), "cpu")
