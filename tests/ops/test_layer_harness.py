"""One harness for every drop-in layer of ``fastqa.layers``: the same state_dict as its twin in
``fastqa.reference`` (loaded either way, same outputs and input gradients), every usable backend equal to
the reference, and a repr that names the layer's arguments and backend."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from helpers import assert_close, compiled_backends, device_of

import fastqa.layers as fast
import fastqa.reference as reference
from fastqa._backend import resolve_backend

B, L, M, C = 2, 11, 5, 16


@dataclass(frozen=True)
class LayerSpec:
    op: str                                             # the functional op the layer calls (for resolve_backend)
    make: Callable[..., torch.nn.Module]                # (module class, **backend kwargs) -> layer
    inputs: Callable[[torch.device], tuple]             # device -> forward arguments
    repr_has: str                                       # a constructor argument the repr must show


def _x(dev, *shape):
    return torch.randn(*shape, device=dev, requires_grad=True)


def _mask(dev, n):
    mask = torch.ones(B, n, dtype=torch.bool, device=dev)
    mask[1, n - 3:] = False  # the second row is padded
    return mask


SPECS = {
    # The conv layers with every option that adds a parameter or an input: ReLU, the depthwise bias, a residual.
    "DepthwiseSeparableConv1d": LayerSpec(
        "dwsep_conv1d", lambda cls, **kw: cls(C, 24, 5, activation="relu", depthwise_bias=True, **kw),
        lambda d: (_x(d, B, L, C), _x(d, B, L, 24)), "activation='relu'"),
    "LayerNormDepthwiseSeparableConv1d": LayerSpec(
        "ln_dwsep_conv1d", lambda cls, **kw: cls(C, 24, 5, activation="relu", depthwise_bias=True, **kw),
        lambda d: (_x(d, B, L, C), _x(d, B, L, 24)), "activation='relu'"),
    "GLUConv1d": LayerSpec("glu_conv1d", lambda cls, **kw: cls(C, 3, causal=True, **kw),
                           lambda d: (_x(d, B, L, C),), "causal=True"),
    "SelfAttention": LayerSpec("self_attention", lambda cls, **kw: cls(C, 4, **kw),
                               lambda d: (_x(d, B, L, C), _mask(d, L)), "heads=4"),
    "TrilinearSimilarity": LayerSpec("trilinear_similarity", lambda cls, **kw: cls(C, **kw),
                                     lambda d: (_x(d, B, L, C), _x(d, B, M, C)), "TrilinearSimilarity"),
    "ContextQueryAttention": LayerSpec("context_query_attention", lambda cls, **kw: cls(C, **kw),
                                       lambda d: (_x(d, B, L, C), _x(d, B, M, C), _mask(d, L), _mask(d, M)),
                                       "ContextQueryAttention"),
    "Linear": LayerSpec("linear", lambda cls, **kw: cls(C, 8, **kw), lambda d: (_x(d, B, L, C),),
                        "in_features=16"),
    "DropoutAdd": LayerSpec("dropout_add", lambda cls, **kw: cls(0.1, **kw),
                            lambda d: (_x(d, B, L, C), _x(d, B, L, C)), "p=0.1"),
    "DecodeAttention": LayerSpec("decode_attention", lambda cls, **kw: cls(**kw),
                                 lambda d: (_x(d, B, 3, C), _x(d, B, L, C), _x(d, B, L, C), None, _mask(d, L)),
                                 "DecodeAttention"),
}


def test_every_layer_has_a_spec():
    assert set(SPECS) == set(fast.__all__)


def _pair(name: str, dev: torch.device, backend: str = "auto"):
    spec = SPECS[name]
    torch.manual_seed(0)
    layer = spec.make(getattr(fast, name), backend=backend).to(dev).eval()
    twin = spec.make(getattr(reference, name)).to(dev).eval()
    return spec, layer, twin


def _outputs(module, args):
    out = module(*args)
    return out if isinstance(out, tuple) else (out,)


def _check_same(layer, twin, spec, dev, what: str) -> None:
    torch.manual_seed(1)
    args = spec.inputs(dev)
    got, want = _outputs(layer, args), _outputs(twin, args)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, name=f"{what}: output {i}")
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = [torch.randn_like(t) for t in got]
    g_layer = torch.autograd.grad(got, leaves, grads, allow_unused=True)
    g_twin = torch.autograd.grad(want, leaves, grads, allow_unused=True)
    for i, (a, b) in enumerate(zip(g_layer, g_twin)):
        if a is None or b is None:
            assert a is None and b is None, f"{what}: gradient {i} exists on one side only"
        else:
            assert_close(a, b, name=f"{what}: input gradient {i}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_state_dict_round_trip_with_the_reference(name):
    dev = torch.device("cpu")
    spec, layer, twin = _pair(name, dev)
    assert list(layer.state_dict()) == list(twin.state_dict())
    twin.load_state_dict(layer.state_dict())
    _check_same(layer, twin, spec, dev, f"{name}: layer -> reference")
    torch.manual_seed(2)
    other = spec.make(getattr(reference, name)).to(dev).eval()
    layer.load_state_dict(other.state_dict())
    _check_same(layer, other, spec, dev, f"{name}: reference -> layer")


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("backend", compiled_backends())
def test_every_usable_backend_equals_the_reference(name, backend):
    dev = device_of(backend)
    spec, layer, twin = _pair(name, dev, backend)
    try:
        resolve_backend(backend, spec.op, dev, torch.float32)
        layer(*spec.inputs(dev))
    except ValueError as e:
        if "has no" not in str(e):
            raise
        pytest.skip(f"{spec.op}: {e}")  # forcing a backend an op lacks raises, as it must
    twin.load_state_dict(layer.state_dict())
    _check_same(layer, twin, spec, dev, f"{name}[{backend}]")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_repr_names_the_arguments_and_backend(name):
    spec = SPECS[name]
    text = repr(spec.make(getattr(fast, name), backend="reference"))
    assert name in text and spec.repr_has in text, text
