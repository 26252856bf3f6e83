"""Seeded dropout of a sublayer's output plus its residual in one pass: autograd Function + dispatch.

Kernels (the C++ CPU backend and the Triton backend, one op each with the same schema and the same hash,
so a seed gives the same mask on every backend)::

    fastqa::dropout_add(branch, residual?, example_scale?, p, Tensor seed) -> out
    fastqa_triton::dropout_add(branch, residual?, example_scale?, p, Tensor seed) -> out

The seed is a one-element int64 tensor on branch's device (the layers draw it there with the device's
generator: no host read per call, and a compiled or captured step reads each call's own seed). The backward
is the same kernel on the gradient (the seed tensor the forward read, no residual): nothing else is saved
for it, not even the mask. The same formula is registered on each op (graphs that call it: torch.export).
"""
from __future__ import annotations

import torch

from .. import reference
from .._backend import resolve_backend, warn_cuda_reference
from .._checks import check_device, check_int, check_number, check_optional, check_tensor
from ._declare import OpDecl, declare, example
from ._function import has_tangent, wants
from ._registry import kernel

_MODULE = "dropout_add"

__all__ = ["dropout_add"]


def _save(ctx, inputs: tuple, outputs: tuple) -> None:
    _, _, example_scale, p, seed = inputs
    # The seed tensor itself, not a copy: save_for_backward's version check refuses a backward whose seed
    # was overwritten in place after the forward read it (its mask would not be the forward's).
    ctx.save_for_backward(example_scale, seed)
    ctx.p = p


def _grads(ctx, grad_out: torch.Tensor) -> dict:
    """The kernel on grad_out (same seed, no residual) for branch, grad_out itself for residual;
    example_scale is a constant."""
    example_scale, seed = ctx.saved_tensors
    grad_branch = None
    if wants(ctx, ctx.input_names, "branch"):
        grad_branch = kernel(ctx.backend, _MODULE, "dropout_add")(grad_out, None, example_scale, ctx.p, seed)
    return {"branch": grad_branch, "residual": grad_out}


def _fake(branch, residual, example_scale, p, seed):
    return branch.new_empty(branch.shape)


# residual + branch * keep(seed) / P(keep) * example_scale through a backend's kernel.
_DROPOUT_ADD = declare(OpDecl("dropout_add", _MODULE, ("branch", "residual", "example_scale", "p", "seed"),
                              _grads, _save, fakes={"dropout_add": _fake}, fwd="dropout_add"))


def dropout_add(branch: torch.Tensor, p: float, seed: int | torch.Tensor, residual: torch.Tensor | None = None,
                example_scale: torch.Tensor | None = None, *, backend: str = "auto") -> torch.Tensor:
    """Inverted dropout of ``branch`` with a mask drawn from ``seed``, scaled per example, plus ``residual``.

    branch: [B, ...]; residual: branch's shape, or None (plain dropout); example_scale: [B] per-example
    factors (stochastic depth: 0 drops the example's branch, 1 / P(survive) keeps it), or None. p: the
    drop probability in [0, 1], quantised to 1/65536; seed: an int64, or a one-element int64 tensor on
    branch's device (``fastqa.reference.draw_device_seed``: drawn there, read there, never by the host).
    Returns residual + branch * keep / P(keep) * example_scale[b], keep a hash of (seed, element index):
    the same seed gives the same mask on every backend. Gradients flow to branch and residual;
    example_scale is treated as a constant. backend: "auto", "reference", "cpu" or "triton".
    """
    # Elementwise: no autocast cast (the output keeps branch's dtype), and empty tensors are fine.
    check_tensor("branch", branch)
    check_device("branch", branch)
    if branch.dim() == 0:
        raise ValueError("branch must have a batch dimension, got a 0-d tensor")
    if residual is not None:
        check_tensor("residual", residual, shape=branch.shape, like=branch)
    check_optional("example_scale", example_scale, shape=(branch.shape[0],), like=branch)
    p = check_number("p", p, low=0, high=1, expected="a float in [0, 1]", error=ValueError)
    seed = _seed_tensor(seed, branch.device)
    resolved = resolve_backend(backend, "dropout_add", branch.device, branch.dtype)
    if resolved == "reference" or has_tangent(branch, residual, example_scale):
        if resolved != "reference":
            warn_cuda_reference("dropout_add", branch.device, "an input carries a forward-mode tangent")
        return reference.dropout_add(branch, p, seed, residual, example_scale)
    return _DROPOUT_ADD.call(resolved, branch, residual, example_scale, p, seed)


def _seed_tensor(seed: object, device: torch.device) -> torch.Tensor:
    """``seed`` as the kernels take it: a one-element int64 tensor on ``device`` (an int is put there)."""
    if isinstance(seed, torch.Tensor):
        if torch.compiler.is_compiling():
            return seed
        if seed.dtype != torch.int64 or seed.numel() != 1:
            raise ValueError(f"seed must be an int64 or a one-element int64 tensor, got a {seed.dtype} tensor "
                             f"of shape {tuple(seed.shape)}")
        if seed.device != device:
            raise ValueError(f"seed must be on {device} like branch, got {seed.device}")
        return seed
    seed = check_int("seed", seed, low=-2 ** 63, high=2 ** 63 - 1, expected="an int64", error=ValueError)
    return torch.tensor(seed, dtype=torch.int64, device=device)


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("dropout_add", lambda d, b: ((d.randn(b, 9, 8), 0.3, 7, d.randn(b, 9, 8)), {}), grads=(0, 3))
