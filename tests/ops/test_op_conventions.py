"""The conventions every op shares (fastqa.ops._function, triton_kernels._common): one clear error on
double backward, the documented empty-batch behaviour, the FASTQA_TRITON_AUTOTUNE switch, one fp32 dot
precision policy."""
from __future__ import annotations

import pytest
import torch

import fastqa
from helpers import compiled_backends, device_of


def _calls(device: torch.device):
    """(op name, differentiable inputs, fn(*inputs, backend) -> tensor) for every op with a backward."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    x, dw, pw = rand(2, 9, 8), rand(8, 1, 3, scale=0.5), rand(6, 8, 1, scale=0.3)
    lnw, lnb = 1 + rand(8, scale=0.1), rand(8, scale=0.1)
    c, q, w = rand(2, 7, 4), rand(2, 5, 4), rand(12, scale=0.3)
    cm, qm = torch.ones(2, 7, dtype=torch.bool, device=device), torch.ones(2, 5, dtype=torch.bool, device=device)
    gw = rand(16, 8, 3, scale=0.2)
    return [
        ("dwsep_conv1d", (x, dw, pw), lambda x, dw, pw, backend: fastqa.dwsep_conv1d(
            x, dw, pw, activation="relu", backend=backend)),
        ("ln_dwsep_conv1d", (x, lnw, lnb, dw, pw), lambda x, lnw, lnb, dw, pw, backend: fastqa.ln_dwsep_conv1d(
            x, lnw, lnb, dw, pw, backend=backend)),
        ("trilinear_similarity", (c, q, w), lambda c, q, w, backend: fastqa.trilinear_similarity(
            c, q, w, backend=backend)),
        ("context_query_attention", (c, q, w), lambda c, q, w, backend: fastqa.context_query_attention(
            c, q, cm, qm, w, backend=backend)),
        ("glu_conv1d", (x, gw), lambda x, gw, backend: fastqa.glu_conv1d(x, gw, causal=True, backend=backend)),
        ("linear", (x, pw[:, :, 0]), lambda x, w, backend: fastqa.linear(x, w, backend=backend)),
        ("dropout_add", (x, x.flip(2)), lambda b, r, backend: fastqa.dropout_add(b, 0.3, 7, r, backend=backend)),
    ]


OPS = [name for name, _, _ in _calls(torch.device("cpu"))]
# No fused kernel of its own on the GPU path: F.linear there, which differentiates twice.
CPU_ONLY = {"linear"}


@pytest.mark.parametrize("op, backend", [(op, backend) for backend in compiled_backends() for op in OPS
                                         if backend == "cpu" or op not in CPU_ONLY])
def test_double_backward_raises_one_clear_error(op, backend):
    """create_graph=True works (first-order gradients are right); differentiating them raises a
    RuntimeError naming the op and the way out, the same for every op and backend."""
    _, inputs, fn = next(call for call in _calls(device_of(backend)) if call[0] == op)
    leaves = [t.clone().requires_grad_() for t in inputs]
    ref_leaves = [t.clone().requires_grad_() for t in inputs]
    grads = torch.autograd.grad((fn(*leaves, backend=backend) ** 2).sum(), leaves, create_graph=True)
    ref_grads = torch.autograd.grad((fn(*ref_leaves, backend="reference") ** 2).sum(), ref_leaves, create_graph=True)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.detach(), want.detach(), atol=2e-4, rtol=2e-4)
    second = sum((g ** 2).sum() for g in grads)
    with pytest.raises(RuntimeError, match=rf"fastqa\.{op}: double backward .* backend='reference'"):
        second.backward()
    # The message's advice works: the reference backend differentiates twice.
    sum((g ** 2).sum() for g in ref_grads).backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in ref_leaves)


def test_first_order_backward_needs_no_graph():
    """A plain backward (no create_graph) returns gradients that carry no graph."""
    _, (x, dw, pw), fn = _calls(torch.device("cpu"))[0]
    x = x.clone().requires_grad_()
    gx, = torch.autograd.grad(fn(x, dw, pw, backend="cpu").sum(), x)
    assert gx.grad_fn is None and not gx.requires_grad


def _empty_batch_calls(device: torch.device):
    """(op name, fn(backend) -> result) with a batch of 0 in the first input, for every public op."""
    def rand(*shape):
        return torch.randn(*shape).to(device)

    def bools(*shape):
        return torch.ones(*shape, dtype=torch.bool, device=device)

    x, dw, pw, lnw, lnb = rand(0, 9, 8), rand(8, 1, 3), rand(6, 8, 1), rand(8), rand(8)
    c, q, w = rand(0, 7, 4), rand(0, 5, 4), rand(12)
    gw = rand(16, 8, 3)
    qkv = rand(0, 6, 12)
    return {
        "dwsep_conv1d": lambda backend: fastqa.dwsep_conv1d(x, dw, pw, backend=backend),
        "ln_dwsep_conv1d": lambda backend: fastqa.ln_dwsep_conv1d(x, lnw, lnb, dw, pw, backend=backend),
        "trilinear_similarity": lambda backend: fastqa.trilinear_similarity(c, q, w, backend=backend),
        "context_query_attention": lambda backend: fastqa.context_query_attention(
            c, q, bools(0, 7), bools(0, 5), w, backend=backend),
        "glu_conv1d": lambda backend: fastqa.glu_conv1d(x, gw, causal=True, backend=backend),
        "glu_conv1d_step": lambda backend: fastqa.glu_conv1d_step(x[:, 0], x[:, :2], gw, backend=backend),
        "self_attention": lambda backend: fastqa.self_attention(qkv, bools(0, 6), 2, backend=backend),
        "decode_attention": lambda backend: fastqa.decode_attention(rand(0, 1, 4), rand(0, 5, 4), rand(0, 5, 3),
                                                                    backend=backend),
        "linear": lambda backend: fastqa.linear(x, pw[:, :, 0], backend=backend),
        "linear_argmax": lambda backend: fastqa.linear_argmax(x, pw[:, :, 0], None, [1], backend=backend),
        "dropout_add": lambda backend: fastqa.dropout_add(x, 0.3, 7, x, backend=backend),
    }


# Elementwise and per-row ops accept an empty batch as torch's do (nn.Linear, dropout): an empty result.
ACCEPT_EMPTY = {"linear": (0, 9, 6), "linear_argmax": (0, 9), "dropout_add": (0, 9, 8)}


@pytest.mark.parametrize("backend", ["reference", *compiled_backends()])
@pytest.mark.parametrize("op", list(_empty_batch_calls(torch.device("cpu"))))
def test_empty_batch_is_the_documented_one(op, backend):
    """docs/DESIGN.md: an empty batch raises a ValueError naming the argument, on every backend -- except for
    the ops that accept it as torch's own do (``ACCEPT_EMPTY``), which return an empty result of the right
    shape (their gradients: tests/ops/test_linear.py, test_dropout_add.py)."""
    call = _empty_batch_calls(device_of(backend))[op]
    if op in ACCEPT_EMPTY:
        assert tuple(call(backend).shape) == ACCEPT_EMPTY[op]
        return
    first = {"trilinear_similarity": "c", "context_query_attention": "c", "glu_conv1d_step": "x_t",
             "self_attention": "qkv", "decode_attention": "q"}.get(op, "x")
    with pytest.raises(ValueError, match=rf"^{first} must have a non-empty batch"):
        call(backend)


triton = pytest.importorskip("triton")
from fastqa.triton_kernels import _common  # noqa: E402


class _FakeAutotuner:
    """Records how ``_common.launch`` launched it."""

    def __init__(self):
        self.configs = [triton.Config({"BLOCK": 32}, num_warps=2, num_stages=3),
                        triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2)]
        self.calls = []
        outer = self

        class _Fn:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: outer.calls.append(("default config", grid, args, kwargs))

        self.fn = _Fn()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("autotuned", grid, args, kwargs))


def test_autotune_switch_is_honoured_by_launch(monkeypatch):
    kernel = _FakeAutotuner()
    monkeypatch.delenv("FASTQA_TRITON_AUTOTUNE", raising=False)
    _common.launch(kernel, (3,), 1, 2, FLAG=True)
    monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "0")
    _common.launch(kernel, (3,), 1, 2, FLAG=True)
    assert kernel.calls[0] == ("autotuned", (3,), (1, 2), {"FLAG": True})
    how, grid, args, kwargs = kernel.calls[1]
    assert (how, grid, args) == ("default config", (3,), (1, 2))
    assert kwargs["FLAG"] is True and kwargs["BLOCK"] == 32 and kwargs["num_warps"] == 2


def test_every_triton_launch_goes_through_the_switch():
    """No launcher indexes a kernel directly (kernel[grid](...)): all use _common.launch (the autotune switch
    and the device guard)."""
    import inspect
    import re

    from fastqa.triton_kernels import context_query_attention, dropout_add, dwsep_conv1d, glu_conv1d
    for module in (context_query_attention, dropout_add, dwsep_conv1d, glu_conv1d):
        source = inspect.getsource(module)
        assert not re.search(r"\b_\w+\[(grid|lambda|\()", source), module.__name__
        assert "launch(" in source


def test_one_fp32_dot_precision_policy():
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        want_default = "ieee" if torch.version.hip else "tf32x3"
        assert _common.dot_precision(torch.float32) == want_default
        torch.set_float32_matmul_precision("high")
        assert _common.dot_precision(torch.float32) == ("ieee" if torch.version.hip else "tf32")
    finally:
        torch.set_float32_matmul_precision(old)
    assert _common.dot_precision(torch.float64) == "ieee"
    assert _common.accumulator_dtype(torch.bfloat16) == torch.float32
    assert _common.accumulator_dtype(torch.float64) == torch.float64
