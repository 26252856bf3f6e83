"""The convention every autograd Function of ``fastqa.ops`` follows (``fastqa.ops._declare`` makes them from
each op's declaration; this module holds the pieces).

* ``forward(ctx, backend, <the forward op's inputs in its schema's order>)``: the backend name comes
  first; the kernels come from ``fastqa.ops._registry.kernel``.
* The backward asks ``wants(ctx, ctx.input_names, ...)`` whether a kernel must run at all, and returns
  ``input_grads(ctx, inputs, x=..., weight=...)``: one entry per input, None where autograd does not
  want it -- an absent optional input never is (the backward kernels return None for an absent bias's
  gradient and allocate nothing for it; context_query_attention's still returns an empty tensor, dropped
  there), while an empty gradient of a present input (an empty batch) is kept.
* The backward kernels have no derivative of their own, so every backward is wrapped in
  ``once_differentiable(op)``: it runs without recording a graph, and differentiating its result
  (double backward) raises the same ``RuntimeError`` for every op, naming the op and what to use.
* The same formula is registered on the forward custom op itself (``register_op_autograd``, what
  ``torch.library.register_autograd`` registers), so a graph that calls the op directly -- a module
  exported with ``torch.export`` -- trains with the same gradients and the same double-backward error.
  While ``torch.export`` traces (``exporting()``), the entry points call that op instead of their
  Function, so the exported graph holds the op and its one formula, strict export included.
* Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad``): the functional entry points run
  the reference when an input carries a tangent (``has_tangent``); the custom ops themselves refuse
  it with one clear ``RuntimeError`` rather than dropping the tangent.
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable, Sequence

import torch
from torch.autograd import forward_ad

from ._torch_private import autograd_kernel, delayed_error, forward_ad_level


def wants(ctx, inputs: Sequence[str], *names: str) -> bool:
    """Whether autograd wants the gradient of any of the forward inputs ``names``."""
    return any(ctx.needs_input_grad[inputs.index(name)] for name in names)


def input_grads(ctx, inputs: Sequence[str], **grads: torch.Tensor | None) -> tuple:
    """backward's return value: grads[name] for every input autograd wants, None elsewhere. autograd never
    wants the gradient of an absent (None) input, so what a kernel returns for it (None, or an empty placeholder)
    never gets through, and a present input's empty gradient (an empty batch) is returned as it is, with the
    input's shape."""
    unknown = set(grads) - set(inputs)
    assert not unknown, f"not forward inputs: {sorted(unknown)}"
    return tuple(grads.get(name) if need else None for name, need in zip(inputs, ctx.needs_input_grad))


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
            err_fn = delayed_error(message, len(outputs))
            leaves = [None if o is None else o.detach().requires_grad_() for o in outputs]
            return err_fn(*leaves)

        return wrapper

    return decorate


def exporting() -> bool:
    """Whether ``torch.export`` is tracing (strict or not). The entry points then call their forward custom op
    directly, whose autograd formula is registered on it (``register_op_autograd``), instead of applying
    their autograd.Function: strict export traces with Dynamo, which cannot trace the Functions' backward
    and runs their forward under no_grad, so the exported graph carried no gradient through the op -- a
    gradient silently missing wherever another path (a residual) still carried one. With the op itself in
    the graph, strict and non-strict exports train with the one formula the eager Function uses."""
    return torch.compiler.is_exporting()


def records_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd is recording for any of ``tensors`` (grad mode on and one requires grad): where it
    is not, forward-only entry points run their kernel without a Function."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def has_tangent(*tensors: torch.Tensor | None) -> bool:
    """Whether forward-mode AD carries a tangent through any of ``tensors``: a dual tensor of
    ``torch.autograd.forward_ad`` or an input of ``torch.func.jvp`` (which sets a dual level too)."""
    if forward_ad_level() < 0 or torch.compiler.is_compiling():
        return False
    return any(isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def forward_ad_message(op: str, qualname: str) -> str:
    return (f"fastqa.{op}: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not supported "
            f"by the fused kernel op {qualname}; call the functional fastqa.{op} (it runs the reference "
            f"when an input carries a tangent) or fastqa.{op}(..., backend='reference')")


_REGISTERED: set[str] = set()


def register_op_autograd(qualname: str, op: str, setup_context: Callable, backward: Callable) -> None:
    """Register the autograd formula of the custom op ``qualname`` (``fastqa::<name>_fwd`` or
    ``fastqa_triton::<name>_fwd``) on the op itself, as ``torch.library.register_autograd`` does:
    ``setup_context(ctx, inputs, output)`` and ``backward(ctx, *grad_outputs)`` -> one gradient per op
    input. The backward is ``once_differentiable(op)``; an input with a forward-mode tangent raises
    ``forward_ad_message`` (torch's generated kernel would run the op without it and drop the tangent).
    Idempotent."""
    if qualname in _REGISTERED:
        return
    ns, name = qualname.split("::")
    overload = getattr(getattr(torch.ops, ns), name).default
    kernel_impl = autograd_kernel(overload, once_differentiable(op)(backward), setup_context)
    message = forward_ad_message(op, qualname)

    def checked_kernel(keyset, *args, **kwargs):
        if has_tangent(*args):
            raise RuntimeError(message)
        return kernel_impl(keyset, *args, **kwargs)

    lib = torch.library.Library(ns, "FRAGMENT")
    with warnings.catch_warnings():
        # A torch.library.custom_op (the Triton ops) comes with an Autograd kernel of its own, which
        # this one replaces (on purpose: that one drops forward-mode tangents); torch warns about it.
        # (The message starts with another line: the pattern must match across it.)
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        lib.impl(name, checked_kernel, "Autograd", with_keyset=True, allow_override=True)
    _LIBRARIES.append(lib)  # a Library deregisters its kernels when it is garbage-collected
    _REGISTERED.add(qualname)


_LIBRARIES: list = []
