"""Trilinear similarity and QANet context-query attention: autograd Functions and functional entry points.

Backends run the custom ops ``<ns>::trilinear_similarity_fwd/_bwd`` and
``<ns>::context_query_attention_fwd/_bwd`` (identical schemas in every namespace, see
``fastqa.ops._registry``); ``backend="reference"`` runs ``fastqa.reference`` directly.
"""
from __future__ import annotations

import torch

from .. import reference
from .._backend import resolve_backend, warn_cuda_reference
from .._checks import cast_floating, check_positive, check_tensor, entry_prologue
from ._declare import OpDecl, declare, example
from ._function import has_tangent
from ._registry import cpu_statistics_dtype, kernel, takes_fp32_params

__all__ = ["context_query_attention", "trilinear_similarity"]

_MODULE = "context_query_attention"
_PARAMS = ("c", "q", "weight", "bias")  # the gradients both _bwd ops return, in order


def _sim_save(ctx, inputs: tuple, outputs: tuple) -> None:
    ctx.save_for_backward(*inputs)


def _sim_grads(ctx, grad_s: torch.Tensor) -> dict:
    c, q, weight, bias = ctx.saved_tensors
    return dict(zip(_PARAMS, kernel(ctx.backend, _MODULE, "trilinear_similarity_bwd")(grad_s, c, q, weight, bias)))


def _cqa_grads(ctx, grad_out: torch.Tensor) -> dict:
    """The saved (c, q, c_mask, q_mask, weight, bias, out, aux_row, aux_col): ``out`` goes back to the
    backward so A = out[..., d:2d] is not recomputed; aux is backend-defined."""
    grads = kernel(ctx.backend, _MODULE, "context_query_attention_bwd")(grad_out, *ctx.saved_tensors)
    return dict(zip(_PARAMS, grads))


# Shapes of the C++ ops' results, for torch.compile / opcheck. Every result is contiguous.
def _sim_fwd_fake(c, q, weight, bias):
    return c.new_empty(c.shape[0], c.shape[1], q.shape[1])


def _sim_bwd_fake(grad_s, c, q, weight, bias):
    return _param_grads_fake(c, q, weight, bias)


def _cqa_fwd_fake(c, q, c_mask, q_mask, weight, bias):
    (batch, n, d), m = c.shape, q.shape[1]
    aux = cpu_statistics_dtype(c.dtype)  # the probabilities
    return (c.new_empty(batch, n, 4 * d), c.new_empty(batch, n, m, dtype=aux),
            c.new_empty(batch, n + d, m, dtype=aux))


def _cqa_bwd_fake(grad_out, c, q, c_mask, q_mask, weight, bias, out, aux_row, aux_col):
    return _param_grads_fake(c, q, weight, bias)


def _param_grads_fake(c, q, weight, bias):
    grad_bias = weight.new_empty(0) if bias is None else bias.new_empty(bias.shape)
    return c.new_empty(c.shape), q.new_empty(q.shape), weight.new_empty(weight.shape), grad_bias


_SIMILARITY = declare(OpDecl(
    "trilinear_similarity", _MODULE, ("c", "q", "weight", "bias"), _sim_grads, _sim_save,
    fakes={"trilinear_similarity_fwd": _sim_fwd_fake, "trilinear_similarity_bwd": _sim_bwd_fake}))
_CQA = declare(OpDecl(
    "context_query_attention", _MODULE, ("c", "q", "c_mask", "q_mask", "weight", "bias"), _cqa_grads,
    fakes={"context_query_attention_fwd": _cqa_fwd_fake, "context_query_attention_bwd": _cqa_bwd_fake}))


def _check_similarity_args(c: torch.Tensor, q: object, weight: object, bias: object, fp32: bool) -> None:
    """After ``entry_prologue`` (fp32: its ``fp32_params``, float32 parameters accepted)."""
    check_tensor("q", q, shape=(c.shape[0], None, c.shape[2]), like=c)
    check_positive("q", q, (1,))
    check_tensor("weight", weight, shape=(3 * c.shape[2],), like=c, or_float32=fp32)
    if bias is not None:
        check_tensor("bias", bias, like=c, or_float32=fp32)
        if bias.numel() != 1 or bias.dim() > 1:
            raise ValueError(f"bias must have shape [1] or [], got {tuple(bias.shape)}")


def trilinear_similarity(c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         *, backend: str = "auto") -> torch.Tensor:
    """S[b, i, j] = w · [c_i; q_j; c_i ∘ q_j] (+ bias), without building [B, n, m, 3d].

    c: [B, n, d]; q: [B, m, d]; weight: [3d] = (w_c, w_q, w_cq); bias: [1], [] or None.
    Returns S: [B, n, m]. backend: "auto", "reference", "cpu" or "triton".
    """
    fp32 = takes_fp32_params(backend, "trilinear_similarity", _MODULE, c)
    c, q, weight, bias = entry_prologue("c", c, 3, q, weight, bias, params=2, fp32_params=fp32)
    _check_similarity_args(c, q, weight, bias, fp32)
    backend = resolve_backend(backend, "trilinear_similarity", c.device, c.dtype)
    if backend == "reference" or has_tangent(c, q, weight, bias):
        if backend != "reference":
            warn_cuda_reference("trilinear_similarity", c.device, "an input carries a forward-mode tangent")
        return reference.trilinear_similarity(c, q, *cast_floating(c.dtype, weight, bias))
    return _SIMILARITY.call(backend, c, q, weight, bias)


def context_query_attention(c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor,
                            weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                            backend: str = "auto") -> torch.Tensor:
    """QANet context-query attention, fused.

    c: [B, n, d]; q: [B, m, d]; c_mask: [B, n] bool; q_mask: [B, m] bool (True = real token);
    weight: [3d] = (w_c, w_q, w_cq); bias: [1], [] or None. With S the trilinear similarity, S̄ its
    softmax over the real question words and S̿ over the real context words (a row or column with no
    real word gives zeros): A = S̄q, B = S̄(S̿ᵀc). Returns [c, A, c∘A, c∘B]: [B, n, 4d].
    """
    fp32 = takes_fp32_params(backend, "context_query_attention", _MODULE, c)
    c, q, weight, bias = entry_prologue("c", c, 3, q, weight, bias, params=2, fp32_params=fp32)
    _check_similarity_args(c, q, weight, bias, fp32)
    check_tensor("c_mask", c_mask, shape=(c.shape[0], c.shape[1]), dtype=torch.bool, floating=False, like=c)
    check_tensor("q_mask", q_mask, shape=(q.shape[0], q.shape[1]), dtype=torch.bool, floating=False, like=c)
    backend = resolve_backend(backend, "context_query_attention", c.device, c.dtype)
    if backend == "reference" or has_tangent(c, q, weight, bias):
        if backend != "reference":
            warn_cuda_reference("context_query_attention", c.device, "an input carries a forward-mode tangent")
        return reference.context_query_attention(c, q, c_mask, q_mask, *cast_floating(c.dtype, weight, bias))
    return _CQA.call(backend, c, q, c_mask, q_mask, weight, bias)


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("trilinear_similarity", lambda d, b: ((d.randn(b, 7, 4), d.randn(b, 5, 4), d.randn(12, scale=0.3)), {}),
        grads=(0, 1, 2))
example("context_query_attention", lambda d, b: ((d.randn(b, 7, 4), d.randn(b, 5, 4), d.mask(b, 7), d.mask(b, 5),
                                                  d.randn(12, scale=0.3)), {}), grads=(0, 1, 4))
