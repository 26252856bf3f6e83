"""The conventions every op shares (fastqa.ops._function, triton_kernels._common): one clear error on
double backward, the documented empty-batch behaviour, the FASTQA_TRITON_AUTOTUNE switch, one fp32 dot
precision policy."""
from __future__ import annotations

import inspect

import pytest
import torch

import fastqa
import fastqa.ops
from fastqa.ops._declare import DECLARED, EXAMPLES
from helpers import compiled_backends, device_of


def _call(op: str, device: torch.device, batch: int = 2):
    """(differentiable inputs, fn(*inputs, backend) -> the op's first output) for ``op``'s declared example."""
    example = EXAMPLES[op]
    args, kwargs = example.inputs(device, batch)

    def fn(*leaves, backend):
        full = list(args)
        for i, leaf in zip(example.grads, leaves):
            full[i] = leaf
        out = getattr(fastqa, op)(*full, **kwargs, backend=backend)
        return out[0] if isinstance(out, tuple) else out

    return tuple(args[i] for i in example.grads), fn


def test_every_public_op_declares_an_example():
    """The checks below run every op through its ``Example`` (fastqa.ops._declare): an op without one would
    go unchecked, so it fails here instead; an op with a backward declares what it differentiates."""
    assert set(EXAMPLES) == set(fastqa.ops.__all__), sorted(set(EXAMPLES) ^ set(fastqa.ops.__all__))
    for name in DECLARED:
        assert EXAMPLES[name].grads, f"{name}'s example differentiates nothing"


# The ops with a backward; each runs on the compiled backends its declaration names (linear and
# self_attention have no fused kernel of their own on the GPU path: torch ops there, which differentiate twice).
# Not self_attention: its reference is torch's scaled_dot_product_attention, whose CPU backward has no
# derivative, so the error's advice (backend="reference") does not hold for it.
_WITH_BACKWARD = sorted(set(DECLARED) - {"self_attention"})


@pytest.mark.parametrize("op, backend", [(op, backend) for backend in compiled_backends() for op in _WITH_BACKWARD
                                         if backend in DECLARED[op].decl.backends])
def test_double_backward_raises_one_clear_error(op, backend):
    """create_graph=True works (first-order gradients are right); differentiating them raises a
    RuntimeError naming the op and the way out, the same for every op and backend."""
    inputs, fn = _call(op, device_of(backend))
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
    (x, *rest), fn = _call("dwsep_conv1d", torch.device("cpu"))
    x = x.clone().requires_grad_()
    gx, = torch.autograd.grad(fn(x, *rest, backend="cpu").sum(), x)
    assert gx.grad_fn is None and not gx.requires_grad


# Elementwise and per-row ops accept an empty batch as torch's do (nn.Linear, dropout): an empty result.
ACCEPT_EMPTY = {"linear", "linear_argmax", "dropout_add"}


@pytest.mark.parametrize("backend", ["reference", *compiled_backends()])
@pytest.mark.parametrize("op", sorted(EXAMPLES))
def test_empty_batch_is_the_documented_one(op, backend):
    """docs/DESIGN.md: an empty batch raises a ValueError naming the argument (the op's first), on every
    backend -- except for the ops that accept it as torch's own do (``ACCEPT_EMPTY``), which return an empty
    result of the shape a batch of 2 gives but for the batch (their gradients: tests/ops/test_linear.py,
    test_dropout_add.py)."""
    device = device_of(backend)
    fn = getattr(fastqa, op)
    args, kwargs = EXAMPLES[op].inputs(device, batch=0)
    if op in ACCEPT_EMPTY:
        full_args, full_kwargs = EXAMPLES[op].inputs(device, batch=2)
        want = fn(*full_args, **full_kwargs, backend="reference").shape
        assert tuple(fn(*args, **kwargs, backend=backend).shape) == (0, *want[1:])
        return
    first = next(iter(inspect.signature(fn).parameters))
    with pytest.raises(ValueError, match=rf"^{first} must have a non-empty batch"):
        fn(*args, **kwargs, backend=backend)


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
