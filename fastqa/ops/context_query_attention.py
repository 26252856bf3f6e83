"""Trilinear similarity and QANet context-query attention: autograd Functions and functional entry points.

Backends run the custom ops ``<ns>::trilinear_similarity_fwd/_bwd`` and
``<ns>::context_query_attention_fwd/_bwd`` (identical schemas in every namespace, see
``fastqa.ops._registry``); ``backend="reference"`` runs ``fastqa.reference`` directly.
"""
from __future__ import annotations

import torch

from .. import reference
from .._backend import cpu_available, resolve_backend, warn_cuda_reference
from .._checks import cast_floating, check_positive, check_tensor, entry_prologue
from ._function import exporting, has_tangent, input_grads, once_differentiable, register_op_autograd
from ._registry import cpu_statistics_dtype, exported_op, kernel, qualified, register_autograd_hook, takes_fp32_params

__all__ = ["context_query_attention", "trilinear_similarity"]

_MODULE = "context_query_attention"
_PARAMS = ("c", "q", "weight", "bias")  # the gradients both _bwd ops return, in order


_SIM_INPUTS = ("backend", "c", "q", "weight", "bias")
_CQA_INPUTS = ("backend", "c", "q", "c_mask", "q_mask", "weight", "bias")


def _sim_grads(ctx, grad_s: torch.Tensor) -> dict:
    c, q, weight, bias = ctx.saved_tensors
    return dict(zip(_PARAMS, kernel(ctx.backend, _MODULE, "trilinear_similarity_bwd")(grad_s, c, q, weight, bias)))


def _cqa_save(ctx, backend: str, inputs: tuple, output: tuple) -> None:
    """inputs: the forward op's (c, q, c_mask, q_mask, weight, bias); output: its (out, aux_row, aux_col).
    ``out`` goes back to the backward so A = out[..., d:2d] is not recomputed; aux is backend-defined."""
    ctx.backend = backend
    ctx.save_for_backward(*inputs, *output)


def _cqa_grads(ctx, grad_out: torch.Tensor) -> dict:
    grads = kernel(ctx.backend, _MODULE, "context_query_attention_bwd")(grad_out, *ctx.saved_tensors)
    return dict(zip(_PARAMS, grads))


class _TrilinearSimilarityFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, backend: str, c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.backend = backend
        ctx.save_for_backward(c, q, weight, bias)
        return kernel(backend, _MODULE, "trilinear_similarity_fwd")(c, q, weight, bias)

    @staticmethod
    @once_differentiable("trilinear_similarity")
    def backward(ctx, grad_s: torch.Tensor):
        return input_grads(ctx, _SIM_INPUTS, **_sim_grads(ctx, grad_s))


class _ContextQueryAttentionFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, backend: str, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor,
                weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        inputs = (c, q, c_mask, q_mask, weight, bias)
        output = kernel(backend, _MODULE, "context_query_attention_fwd")(*inputs)
        _cqa_save(ctx, backend, inputs, output)
        return output[0]

    @staticmethod
    @once_differentiable("context_query_attention")
    def backward(ctx, grad_out: torch.Tensor):
        return input_grads(ctx, _CQA_INPUTS, **_cqa_grads(ctx, grad_out))


def _register_autograd(backend: str) -> None:
    """The Functions' formulas on ``<ns>::trilinear_similarity_fwd`` / ``context_query_attention_fwd``
    themselves: graphs that call the ops (torch.export) train with the same gradients."""
    def sim_setup(ctx, inputs, output):
        ctx.backend = backend
        ctx.save_for_backward(*inputs)

    def sim_backward(ctx, grad_s):
        return input_grads(ctx, _SIM_INPUTS[1:], **_sim_grads(ctx, grad_s))

    def cqa_setup(ctx, inputs, output):
        ctx.mark_non_differentiable(*output[1:])
        _cqa_save(ctx, backend, inputs, output)

    def cqa_backward(ctx, grad_out, _grad_row, _grad_col):
        return input_grads(ctx, _CQA_INPUTS[1:], **_cqa_grads(ctx, grad_out))

    register_op_autograd(qualified(backend, "trilinear_similarity_fwd"), "trilinear_similarity", sim_setup,
                         sim_backward)
    register_op_autograd(qualified(backend, "context_query_attention_fwd"), "context_query_attention", cqa_setup,
                         cqa_backward)


register_autograd_hook(_MODULE, _register_autograd)


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
    if exporting():   # the op and the formula registered on it (see exporting())
        return exported_op(backend, "trilinear_similarity_fwd")(c, q, weight, bias)
    return _TrilinearSimilarityFunction.apply(backend, c, q, weight, bias)


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
    if exporting():   # the op and the formula registered on it (see exporting())
        return exported_op(backend, "context_query_attention_fwd")(c, q, c_mask, q_mask, weight, bias)[0]
    return _ContextQueryAttentionFunction.apply(backend, c, q, c_mask, q_mask, weight, bias)


if cpu_available():
    # Shapes of the C++ ops' results, for torch.compile / opcheck. Every result is contiguous.
    @torch.library.register_fake("fastqa::trilinear_similarity_fwd")
    def _trilinear_similarity_fwd_fake(c, q, weight, bias):
        return c.new_empty(c.shape[0], c.shape[1], q.shape[1])

    @torch.library.register_fake("fastqa::trilinear_similarity_bwd")
    def _trilinear_similarity_bwd_fake(grad_s, c, q, weight, bias):
        return _param_grads_fake(c, q, weight, bias)

    @torch.library.register_fake("fastqa::context_query_attention_fwd")
    def _context_query_attention_fwd_fake(c, q, c_mask, q_mask, weight, bias):
        (batch, n, d), m = c.shape, q.shape[1]
        aux = cpu_statistics_dtype(c.dtype)  # the probabilities
        return (c.new_empty(batch, n, 4 * d), c.new_empty(batch, n, m, dtype=aux),
                c.new_empty(batch, n + d, m, dtype=aux))

    @torch.library.register_fake("fastqa::context_query_attention_bwd")
    def _context_query_attention_bwd_fake(grad_out, c, q, c_mask, q_mask, weight, bias, out, aux_row, aux_col):
        return _param_grads_fake(c, q, weight, bias)

    def _param_grads_fake(c, q, weight, bias):
        grad_bias = weight.new_empty(0) if bias is None else bias.new_empty(bias.shape)
        return c.new_empty(c.shape), q.new_empty(q.shape), weight.new_empty(weight.shape), grad_bias
