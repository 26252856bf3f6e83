"""An op with a gradient is declared once (``OpDecl``); ``declare`` makes the rest from the declaration.

A declaration names the forward custom op ``<ns>::<name>_fwd`` (its schema is the kernels' own:
``m.def`` in csrc/cpu/<op>.cpp, ``_SCHEMAS`` in triton_kernels/<op>.py; tests/ops/test_op_schemas.py holds
the two equal), its inputs in the schema's order, what the backward keeps (``save``), the gradient formula
(``grads``: calls the backward kernel, returns the gradients by input name) and the fake kernels of the C++
ops. From it ``declare`` makes:

* the autograd Function (``Op.apply(backend, *inputs)``, the convention of ``fastqa.ops._function``: the
  backend first, ``once_differentiable`` backward, ``input_grads``);
* the same formula registered on the forward custom op of each backend (``register_op_autograd``: at once
  for the C++ ops, when the Triton kernel module is imported for the Triton ones), so graphs that call the
  op (``torch.export``) train with the same gradients, and ``Op.call`` that picks the op or the Function;
* the fake kernels of the ``fastqa::`` ops (torch.compile, opcheck; the Triton module registers its own
  with its ops).

The forward op returns the output autograd differentiates first; any further results (``aux``: what the
backward wants, backend-defined) are marked non-differentiable and handed to ``save`` unread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .._backend import cpu_available
from ._function import exporting, input_grads, once_differentiable, register_op_autograd
from ._registry import exported_op, kernel, qualified, register_autograd_hook
from ._torch_private import op_schema


def save_all(ctx, inputs: tuple, outputs: tuple) -> None:
    """The default ``save``: every tensor input (None included) and every output, in order."""
    ctx.save_for_backward(*inputs, *outputs)


@dataclass(frozen=True)
class OpDecl:
    """One differentiable op. ``name``: the op (forward custom op ``<name>_fwd``); ``module``: its kernel module
    (csrc/cpu/<module>.cpp, triton_kernels/<module>.py, fastqa/ops/<module>.py); ``inputs``: the forward op's
    argument names, in schema order; ``grads(ctx, grad)``: {input name: gradient} (``ctx.backend`` names the
    backend); ``save(ctx, inputs, outputs)``: what ``grads`` reads (the forward op's inputs and its results,
    tuples); ``fakes``: {C++ op name: fake kernel}; ``fwd``: the forward op's name when it is not ``<name>_fwd``.
    ``grads`` may ask ``wants(ctx, ctx.input_names, name)`` whether a gradient is wanted at all; ``backends``:
    those with kernels for the op (``fastqa.ops._registry``'s names); ``alias``: (input, other) that callers may
    give one tensor (a residual that is x): Dynamo cannot trace an autograd.Function given the same tensor
    twice, so the Function then gets it once (``input`` None) and adds ``input``'s gradient to ``other``'s."""

    name: str
    module: str
    inputs: tuple[str, ...]
    grads: Callable[..., dict]
    save: Callable[[Any, tuple, tuple], None] = save_all
    fakes: dict[str, Callable] = field(default_factory=dict)
    fwd: str = ""
    backends: tuple[str, ...] = ("cpu", "triton")
    alias: tuple[str, ...] = ()

    @property
    def forward_op(self) -> str:
        return self.fwd or self.name + "_fwd"


DECLARED: dict[str, "Op"] = {}
"""Every op ``declare`` has made, by name (tests/ops/test_op_schemas.py checks them against the schemas)."""


class Op:
    """What ``declare`` makes of an ``OpDecl``: ``call(backend, *inputs)`` runs the op with its gradient."""

    def __init__(self, decl: OpDecl, function: type[torch.autograd.Function]):
        self.decl = decl
        self.function = function

    def call(self, backend: str, *inputs: Any) -> torch.Tensor:
        """The op's differentiable output for the forward op's ``inputs``: through the Function, or while
        ``torch.export`` traces, the forward op itself and the formula registered on it (see ``exporting``)."""
        if exporting():
            return _first(exported_op(backend, self.decl.forward_op)(*inputs))
        if self.decl.alias:
            one, other = (self.decl.inputs.index(name) for name in self.decl.alias)
            aliased = inputs[one] is not None and inputs[one] is inputs[other]
            inputs = (*inputs[:one], None, *inputs[one + 1:]) if aliased else inputs
            return self.function.apply(backend, *inputs, aliased)
        return self.function.apply(backend, *inputs)


def _first(outputs: Any) -> torch.Tensor:
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _as_tuple(outputs: Any) -> tuple:
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)


def declare(decl: OpDecl) -> Op:
    """The autograd Function, the op's autograd registration and the C++ ops' fake kernels of ``decl``."""
    function_inputs = ("backend", *decl.inputs, *(("aliased",) if decl.alias else ()))
    fwd = decl.forward_op
    one, other = (decl.inputs.index(name) for name in decl.alias) if decl.alias else (0, 0)

    def forward(ctx, backend: str, *inputs: Any) -> torch.Tensor:
        ctx.aliased = bool(decl.alias) and inputs[-1]
        if decl.alias:
            inputs = inputs[:-1]
            if ctx.aliased:
                inputs = (*inputs[:one], inputs[other], *inputs[one + 1:])
        outputs = _as_tuple(kernel(backend, decl.module, fwd)(*inputs))
        ctx.backend, ctx.input_names = backend, function_inputs
        decl.save(ctx, inputs, outputs)
        return outputs[0]

    def backward(ctx, grad: torch.Tensor) -> tuple:
        grads = decl.grads(ctx, grad)
        if ctx.aliased and grads.get(decl.alias[1]) is not None and grads.get(decl.alias[0]) is not None:
            grads[decl.alias[1]] = grads[decl.alias[1]] + grads[decl.alias[0]]
        return input_grads(ctx, function_inputs, **grads)

    function = type(f"_{_camel(decl.name)}Function", (torch.autograd.Function,), {
        "__doc__": f"fastqa.{decl.name} through a backend's fused kernels (declared by fastqa.ops._declare).",
        "forward": staticmethod(forward),
        "backward": staticmethod(once_differentiable(decl.name)(backward)),
    })

    def register(backend: str) -> None:
        if backend not in decl.backends:
            return

        def setup_context(ctx, inputs: tuple, output: Any) -> None:
            outputs = _as_tuple(output)
            if len(outputs) > 1:
                ctx.mark_non_differentiable(*(t for t in outputs[1:] if t is not None))
            ctx.backend, ctx.input_names = backend, decl.inputs
            decl.save(ctx, tuple(inputs), outputs)

        def op_backward(ctx, grad: torch.Tensor, *_aux_grads: Any) -> tuple:
            return input_grads(ctx, decl.inputs, **decl.grads(ctx, grad))

        check_inputs(decl, backend)
        register_op_autograd(qualified(backend, fwd), decl.name, setup_context, op_backward)

    register_autograd_hook(decl.module, register)
    if cpu_available():
        for op_name, fake in decl.fakes.items():
            torch.library.register_fake(qualified("cpu", op_name))(fake)
    DECLARED[decl.name] = Op(decl, function)
    return DECLARED[decl.name]


def check_inputs(decl: OpDecl, backend: str) -> None:
    """The declared inputs are the registered forward op's arguments (a declaration out of step with its
    schema would hand the gradients to the wrong inputs)."""
    schema = op_schema(exported_op(backend, decl.forward_op))
    names = tuple(arg.name for arg in schema.arguments)
    if names != decl.inputs:
        raise RuntimeError(f"fastqa.ops: the declaration of {decl.name} lists inputs {decl.inputs}, but "
                           f"{qualified(backend, decl.forward_op)} takes {names}")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


class Draw:
    """What an op's example draws its inputs with: seeded standard-normal tensors (times ``scale``) and
    all-True padding masks, on one device (drawn on the CPU, so every device sees the same values)."""

    def __init__(self, device: torch.device | str, seed: int = 0):
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.generator) * scale).to(self.device)

    def mask(self, *shape: int) -> torch.Tensor:
        return torch.ones(*shape, dtype=torch.bool, device=self.device)


@dataclass(frozen=True)
class Example:
    """A small call of the public op ``fastqa.<op>``: ``make(draw, batch)`` -> (args, kwargs) without
    ``backend``, its tensors from ``draw`` (a ``Draw``) with ``batch`` rows (0: an empty batch); ``grads``: the
    positions in args of the inputs it differentiates (empty for an op without a backward). The checks every
    op gets take their inputs from it (tests/ops/test_op_conventions.py: double backward, empty batches;
    tests/ops/test_gpu_paths.py: the GPU path reads nothing on the host, the device guard), so a new op declares
    one beside itself and nothing in those tests."""

    op: str
    make: Callable[[Draw, int], tuple[tuple, dict]]
    grads: tuple[int, ...] = ()

    def inputs(self, device: torch.device | str = "cpu", batch: int = 2, seed: int = 0) -> tuple[tuple, dict]:
        return self.make(Draw(device, seed), batch)


EXAMPLES: dict[str, Example] = {}
"""Every public op's example, by name (tests/ops/test_op_conventions.py checks that each has one)."""


def example(op: str, make: Callable[[Draw, int], tuple[tuple, dict]], grads: tuple[int, ...] = ()) -> None:
    """Register ``op``'s ``Example``."""
    EXAMPLES[op] = Example(op, make, grads)
