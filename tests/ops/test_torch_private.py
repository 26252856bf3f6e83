"""The private torch APIs of fastqa.ops (fastqa/ops/_torch_private.py) exist in this torch and behave as
relied on; on a torch that moved one, the failure names it."""
from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad

from fastqa.ops import _torch_private as private


@pytest.mark.parametrize("path", private.PRIVATE)
def test_private_api_exists(path):
    try:
        private.resolve(path)
    except (AttributeError, ImportError) as exc:
        pytest.fail(f"this torch ({torch.__version__}) has no {path}, which fastqa/ops/_torch_private.py uses: "
                    f"{exc}")


def test_resolve_names_what_is_missing():
    with pytest.raises(AttributeError):
        private.resolve("torch._C._no_such_private_api")


def test_below_autograd_skips_autograd():
    x = torch.ones(2, requires_grad=True)
    with private.below_autograd():
        y = torch.ops.aten.mul.Tensor(x, x)
    assert y.grad_fn is None


def test_delayed_error_raises_its_message():
    x = torch.ones(1, requires_grad=True)
    (y,) = (private.delayed_error(b"no double backward here", 1)(x),)
    with pytest.raises(RuntimeError, match="no double backward here"):
        y.sum().backward()


def test_forward_ad_level():
    assert private.forward_ad_level() < 0
    with forward_ad.dual_level():
        assert private.forward_ad_level() >= 0


def test_registered_op_names_lists_aten():
    assert "aten::mul.Tensor" in private.registered_op_names() or "aten::mul" in private.registered_op_names()


def test_op_schema_names_the_arguments():
    schema = private.op_schema(torch.ops.aten.relu)
    assert [a.name for a in schema.arguments] == ["self"]
    assert str(schema) == "aten::relu(Tensor self) -> Tensor"


def test_registering_the_autograd_formulas_warns_nothing():
    """The Triton ops (torch.library.custom_op) come with an Autograd kernel that fastqa's formula replaces on
    purpose: torch's override warning (a message of several lines) is silenced there, not shown to users."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    run = subprocess.run([sys.executable, "-W", "error:Warning only once", "-c",
                          "import fastqa.ops, fastqa.triton_kernels"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
