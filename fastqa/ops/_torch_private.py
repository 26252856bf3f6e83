"""The private torch APIs fastqa.ops relies on, in one place (nothing else in fastqa.ops reaches into
``torch._*``). ``tests/ops/test_torch_private.py`` imports each of them by the name listed in ``PRIVATE``
and fails naming the one a torch release moved or removed.

* ``below_autograd()``: run an op past its Autograd dispatch key (``torch._C._AutoDispatchBelowAutograd``),
  what the Functions do, since they handle gradients themselves.
* ``delayed_error(message, n)``: the node ``torch.autograd.function.once_differentiable`` uses to raise
  when a gradient is differentiated (``torch.autograd.function._functions.DelayedError``).
* ``autograd_kernel(overload, backward, setup_context)``: the Autograd kernel ``torch.library.register_autograd``
  builds (``torch._library.autograd.make_autograd_impl`` and ``Info``), registered with a forward-mode check
  that the public function has no room for.
* ``forward_ad_level()``: the current dual level (``torch.autograd.forward_ad._current_level``; -1 outside
  ``forward_ad.dual_level`` and ``torch.func.jvp``).
* ``registered_op_names()``: the qualified names of every registered operator
  (``torch._C._dispatch_get_all_op_names``).
* ``op_schema(packet)``: a custom op's ``torch.FunctionSchema`` (its default overload's ``_schema``).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch.autograd import forward_ad

PRIVATE = (
    "torch._C._AutoDispatchBelowAutograd",
    "torch.autograd.function._functions.DelayedError",
    "torch._library.autograd.make_autograd_impl",
    "torch._library.autograd.Info",
    "torch.autograd.forward_ad._current_level",
    "torch._C._dispatch_get_all_op_names",
)
"""Every private name used here, as a dotted path from ``torch`` (what the test resolves)."""


def resolve(path: str) -> Any:
    """The object at a dotted path in ``PRIVATE`` (importing its modules); AttributeError or ImportError
    when this torch does not have it."""
    parts = path.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if not hasattr(obj, part):
            try:
                importlib.import_module(".".join(parts[:i + 1]))
            except ImportError:
                pass
        obj = getattr(obj, part)
    return obj


def below_autograd() -> Any:
    """A context manager: ops called inside skip their Autograd kernel."""
    return torch._C._AutoDispatchBelowAutograd()


def delayed_error(message: bytes, num_outputs: int) -> Any:
    """An autograd node whose backward raises RuntimeError(message)."""
    from torch.autograd import function as autograd_function
    return autograd_function._functions.DelayedError(message, num_outputs)


def autograd_kernel(overload: Any, backward: Callable, setup_context: Callable) -> Callable:
    """The Autograd kernel ``torch.library.register_autograd`` makes for ``overload`` (called with a keyset)."""
    from torch._library.autograd import Info, make_autograd_impl
    return make_autograd_impl(overload, Info(backward, setup_context))


def forward_ad_level() -> int:
    return forward_ad._current_level


def registered_op_names() -> list[str]:
    return list(torch._C._dispatch_get_all_op_names())


def op_schema(packet: Any) -> Any:
    """The schema of ``packet`` (e.g. ``torch.ops.fastqa.glu_conv1d_fwd``): ``.arguments`` (each with ``.name``),
    ``.returns``; ``str()`` gives ``ns::name(args) -> returns``."""
    return packet.default._schema
