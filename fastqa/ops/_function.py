"""The convention every autograd Function of ``fastqa.ops`` follows.

* ``forward(ctx, backend, <tensors in the functional signature's order>, <settings>)``: the backend
  name comes first; the kernels come from ``fastqa.ops._registry.kernel``.
* Each Function names its forward inputs in a module-level tuple (``_<OP>_INPUTS``, ``"backend"``
  first; module level because Dynamo cannot trace a class attribute's methods); the backward asks
  ``wants(ctx, INPUTS, ...)`` whether a kernel must run at all, and returns
  ``input_grads(ctx, INPUTS, x=..., weight=...)``: one entry per input, None where autograd does not
  want it or the input was absent (the kernels return an empty tensor for an absent optional input).
* The backward kernels have no derivative of their own, so every backward is wrapped in
  ``once_differentiable(op)``: it runs without recording a graph, and differentiating its result
  (double backward) raises the same ``RuntimeError`` for every op, naming the op and what to use.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from torch.autograd import function as _autograd_function


def none_if_empty(t: torch.Tensor | None) -> torch.Tensor | None:
    """Kernels return an empty tensor for the gradient of an absent optional input."""
    return None if t is None or t.numel() == 0 else t


def wants(ctx, inputs: Sequence[str], *names: str) -> bool:
    """Whether autograd wants the gradient of any of the forward inputs ``names``."""
    return any(ctx.needs_input_grad[inputs.index(name)] for name in names)


def input_grads(ctx, inputs: Sequence[str], **grads: torch.Tensor | None) -> tuple:
    """backward's return value: grads[name] for every input autograd wants, None elsewhere."""
    unknown = set(grads) - set(inputs)
    assert not unknown, f"not forward inputs: {sorted(unknown)}"
    return tuple(none_if_empty(grads.get(name)) if need else None
                 for name, need in zip(inputs, ctx.needs_input_grad))


def double_backward_message(op: str) -> str:
    return (f"fastqa.{op}: double backward (differentiating a gradient, e.g. autograd.grad(..., "
            f"create_graph=True) then backward) is not supported by the fused kernels; "
            f"call fastqa.{op}(..., backend='reference') for higher-order gradients")


def once_differentiable(op: str) -> Callable:
    """``torch.autograd.function.once_differentiable`` with an error message that names ``op``."""
    message = double_backward_message(op).encode()

    def decorate(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def wrapper(ctx, *grad_outputs):
            with torch.no_grad():
                outputs = backward(ctx, *grad_outputs)
            if not torch.is_grad_enabled() or not any(
                    isinstance(t, torch.Tensor) and t.requires_grad for t in (*grad_outputs, *ctx.saved_tensors)):
                return outputs
            # create_graph=True: hand back aliases whose grad_fn raises when differentiated.
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            err_fn = _autograd_function._functions.DelayedError(message, len(outputs))
            leaves = [None if o is None else o.detach().requires_grad_() for o in outputs]
            return err_fn(*leaves)

        return wrapper

    return decorate
