"""Every ``fastqa_triton::`` custom op has the schema of its ``fastqa::`` twin (the C++ one): the autograd
Functions and fake kernels of ``fastqa.ops`` call both through one declaration, so a schema written
differently in csrc/cpu/<op>.cpp and triton_kernels/<op>.py would break one backend only.

Both namespaces are registered in this process: the C++ extension, and the Triton ops under the
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import fastqa.ops  # noqa: F401  (registers both namespaces where they can run)
from fastqa._backend import cpu_available, triton_usable_here
from fastqa.ops._declare import DECLARED, check_inputs
from fastqa.ops._torch_private import op_schema, registered_op_names

pytestmark = pytest.mark.skipif(not (cpu_available() and triton_usable_here()),
                                reason="needs the C++ extension and Triton (or its interpreter)")


def _ops(namespace: str) -> dict[str, str]:
    """name -> the schema without its namespace, for every op registered in ``namespace``."""
    prefix = f"{namespace}::"
    out = {}
    for qualname in registered_op_names():
        if qualname.startswith(prefix):
            name = qualname[len(prefix):]
            schema = op_schema(getattr(getattr(torch.ops, namespace), name))
            out[name] = str(schema).split("::", 1)[1]
    return out


def test_every_triton_op_has_the_schema_of_its_cpp_twin():
    cpp, triton = _ops("fastqa"), _ops("fastqa_triton")
    assert triton, "no fastqa_triton:: op is registered"
    assert not set(triton) - set(cpp), f"Triton ops without a C++ twin: {sorted(set(triton) - set(cpp))}"
    differ = {name: (cpp[name], triton[name]) for name in triton if cpp[name] != triton[name]}
    assert not differ, "schemas differ (C++ vs Triton):\n" + "\n".join(
        f"  {name}:\n    fastqa::{c}\n    fastqa_triton::{t}" for name, (c, t) in differ.items())


def test_the_comparison_sees_a_difference():
    # The test above compares schema strings that carry argument names, types, optionality and returns.
    a = torch._C.parse_schema("x(Tensor a, Tensor? b) -> Tensor")
    b = torch._C.parse_schema("x(Tensor a, Tensor b) -> Tensor")
    assert str(a) != str(b)


def test_every_op_with_a_backward_is_declared_with_its_schemas_inputs():
    """An op with a backward kernel gets its autograd formula from one declaration (fastqa.ops._declare),
    whose inputs are the forward op's arguments on every backend that has it."""
    with_backward = {name[:-len("_bwd")] for name in _ops("fastqa") if name.endswith("_bwd")}
    assert with_backward, "no fastqa:: op with a backward is registered"
    assert with_backward <= set(DECLARED), f"not declared: {sorted(with_backward - set(DECLARED))}"
    for name, op in DECLARED.items():
        for backend in op.decl.backends:
            check_inputs(op.decl, backend)   # raises on a mismatch


def test_a_declaration_out_of_step_with_its_schema_is_refused():
    decl = dataclasses.replace(DECLARED["glu_conv1d"].decl, inputs=("x", "bias", "weight", "mask", "pad_left",
                                                                     "residual", "scale"))
    with pytest.raises(RuntimeError, match=r"declaration of glu_conv1d lists inputs .* fastqa::glu_conv1d_fwd takes"):
        check_inputs(decl, "cpu")
