"""Backend selection: auto, forced, environment override, fallback warnings, info()."""
import warnings

import pytest
import torch

import fastqa
from fastqa import _backend
from fastqa._backend import resolve_backend

CPU = torch.device("cpu")
needs_ext = pytest.mark.skipif(not _backend.cpu_available(), reason="fastqa._C not built")


@needs_ext
def test_auto_picks_cpu_extension_for_float_cpu_tensors(monkeypatch):
    monkeypatch.delenv("FASTQA_BACKEND", raising=False)
    assert resolve_backend("auto", "op", CPU, torch.float32) == "cpu"
    assert resolve_backend(None, "op", CPU, torch.float64) == "cpu"
    assert resolve_backend(None, "op", CPU, torch.bfloat16) == "cpu"


def test_auto_falls_back_to_reference_with_one_warning(monkeypatch):
    monkeypatch.delenv("FASTQA_BACKEND", raising=False)
    monkeypatch.setattr(_backend, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="falling back to the reference"):
        assert resolve_backend("auto", "fallback_op", CPU, torch.float16) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second fallback for the same reason stays quiet
        assert resolve_backend("auto", "fallback_op", CPU, torch.float16) == "reference"


def test_environment_forces_a_backend(monkeypatch):
    monkeypatch.setenv("FASTQA_BACKEND", "reference")
    assert resolve_backend("auto", "op", CPU, torch.float32) == "reference"
    # An explicit argument wins over the environment.
    assert resolve_backend("reference", "op", CPU, torch.float32) == "reference"


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda-graphs", "op", CPU, torch.float32)
    with pytest.raises(TypeError, match="backend must be a str"):
        resolve_backend(3, "op", CPU, torch.float32)


def test_forcing_an_unusable_backend_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        resolve_backend("triton", "op", CPU, torch.float32)
    with pytest.raises(RuntimeError, match="float32, float64 or bfloat16"):
        resolve_backend("cpu", "op", CPU, torch.float16)


@needs_ext
def test_cpu_backend_refuses_non_cpu_tensors():
    with pytest.raises(RuntimeError, match="CPU tensors"):
        resolve_backend("cpu", "op", torch.device("meta"), torch.float32)


def test_info_reports_what_is_built():
    info = fastqa.info()
    assert info["fastqa"] == fastqa.__version__
    assert info["torch"] == torch.__version__
    assert info["backends"]["reference"] is True
    assert info["backends"]["cpu"] == _backend.cpu_available()
    if info["backends"]["cpu"]:
        assert info["cpu_extension"]["simd"] in ("avx512", "avx2", "baseline")
        assert info["cpu_extension_error"] is None
    else:
        assert "fastqa._C" in info["cpu_extension_error"]


@pytest.mark.parametrize("flags,want", [
    ("fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "amx_bf16"),
    ("fpu sse avx2 avx512f avx512_bf16 avx512_vnni", "avx512_bf16"),
    ("fpu sse avx2 fma", "none"),
])
def test_cpu_bf16_support_reads_the_cpu_flags(flags, want):
    from fastqa._backend import cpu_bf16_support

    assert cpu_bf16_support(f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n") == want
    assert cpu_bf16_support("processor\t: 0\n") is None            # no flags line: unknown
    assert fastqa.info()["cpu_bf16"] in ("amx_bf16", "avx512_bf16", "none", None)
