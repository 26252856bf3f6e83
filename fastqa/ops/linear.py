"""Linear map (nn.Linear) on the CPU kernels' GEMM entry point: autograd Function + dispatch.

Kernels (the C++ CPU backend; the GPU backend, "triton", has no kernel of its own: it runs ``F.linear`` on
cuBLAS, and ``linear_argmax`` as that GEMM, fills of the excluded columns and ``argmax`` -- torch ops with
no host synchronisation)::

    fastqa::linear_fwd(x, weight, bias?) -> y
    fastqa::linear_bwd(grad_y, x, weight, output_mask) -> (grad_x?, grad_weight?, grad_bias?)   # None where
                                                                                   # output_mask is False
    fastqa::linear_argmax(x, weight, bias?, exclude) -> index    # forward only: argmax of the output
Each of the three products runs on the GEMM engine measured fastest for its shape (``FASTQA_CPU_GEMM``,
``fastqa.info()["cpu_extension"]["gemm"]["shapes"]``): where oneDNN beats BLAS on a shape (a vocabulary
projection on an AMD processor: ~2x), the model's linear maps get that speed; elsewhere they run what
``F.linear`` runs.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from .. import reference
from .._backend import resolve_backend
from .._checks import autocast_dtype, cast_floating, check_device, check_optional, check_positive, check_tensor
from ._declare import OpDecl, declare, example
from ._function import exporting, has_tangent, records_grad, wants
from ._registry import kernel, takes_fp32_params

_MODULE = "linear"

__all__ = ["linear", "linear_argmax"]


def _save(ctx, inputs: tuple, outputs: tuple) -> None:
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight)


def _grads(ctx, grad_y: torch.Tensor) -> dict:
    """The kernel computes (and allocates) only the gradients autograd wants: never an absent bias's."""
    x, weight = ctx.saved_tensors
    names = ("x", "weight", "bias")
    output_mask = [wants(ctx, ctx.input_names, name) for name in names]
    if not any(output_mask):
        return {}
    return dict(zip(names, kernel(ctx.backend, _MODULE, "linear_bwd")(grad_y, x, weight, output_mask)))


def _fwd_fake(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _argmax_fake(x, weight, bias, exclude):
    return x.new_empty(x.shape[:-1], dtype=torch.long)


def _bwd_fake(grad_y, x, weight, output_mask):   # the parameters' gradients in weight's dtype
    shapes = ((x, x.shape), (weight, weight.shape), (weight, (weight.shape[0],)))
    return tuple(like.new_empty(shape) if wanted else None for wanted, (like, shape) in zip(output_mask, shapes))


# x Wᵀ + b through the C++ kernels, each product on the engine measured fastest for its shape (the GPU path
# is F.linear itself).
_LINEAR = declare(OpDecl("linear", _MODULE, ("x", "weight", "bias"), _grads, _save, backends=("cpu",),
                         fakes={"linear_fwd": _fwd_fake, "linear_argmax": _argmax_fake, "linear_bwd": _bwd_fake}))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           backend: str = "auto") -> torch.Tensor:
    """``F.linear``: x [..., K] (at least one leading dimension, any strides, sizes 0 included: an empty
    batch gives an empty output, as ``nn.Linear``), weight [N, K], bias [N] or None -> [..., N] = x Wᵀ + b.

    backend: "auto", "reference", "cpu" or "triton" (the GPU path: ``F.linear`` on cuBLAS, what "auto" runs
    on CUDA).
    """
    x, weight, bias = _check_arguments(x, weight, bias, takes_fp32_params(backend, "linear", _MODULE, x))
    resolved = resolve_backend(backend, "linear", x.device, x.dtype)
    if resolved != "cpu" or has_tangent(x, weight, bias):
        return reference.linear(x, weight, bias)   # "triton" too: the GPU path is F.linear itself
    if not records_grad(x, weight, bias) and not exporting():
        # Nothing to differentiate (inference, decoding): the kernel alone, without the Function's cost.
        return kernel(resolved, _MODULE, "linear_fwd")(x, weight, bias)
    return _LINEAR.call(resolved, x, weight, bias)


def linear_argmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  exclude: Sequence[int] = (), *, backend: str = "auto") -> torch.Tensor:
    """The index of the largest output feature: x [..., K], weight [N, K], bias [N] or None -> [...] int64 =
    argmax over N of ``linear(x, weight, bias)``, never a feature in ``exclude`` (ids in [0, N), not all of
    them: excluding every id is a ValueError naming ``exclude``). The rule, the same on every backend: the
    first allowed id holding the largest allowed logit, a NaN counting as the largest (torch.argmax's rule
    for ties and NaN); so a row whose allowed logits are all -inf gives the lowest allowed id, never an
    excluded one. Greedy decoding's next token: the C++ kernel scans each row of logits with vector
    instructions right after the GEMM (several times faster than torch.argmax's scan of a vocabulary-sized
    block). An empty batch gives an empty result. No gradient (the result is indices).

    backend: "auto", "reference", "cpu" or "triton" (the GPU path, ``device_linear_argmax``: what "auto"
    runs on CUDA).
    """
    x, weight, bias = _check_arguments(x, weight, bias, takes_fp32_params(backend, "linear_argmax", _MODULE, x))
    exclude = _check_exclude(exclude, weight.shape[0])
    resolved = resolve_backend(backend, "linear_argmax", x.device, x.dtype)
    if resolved == "triton":
        return device_linear_argmax(x, weight, bias, exclude)
    if resolved != "cpu":
        return reference.linear_argmax(x, weight, bias, exclude)
    return kernel(resolved, _MODULE, "linear_argmax")(x, weight, bias, exclude)


def device_linear_argmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         exclude: Sequence[int] = ()) -> torch.Tensor:
    """The GPU path of ``linear_argmax`` (arguments as there, already checked): x [..., K] -> [...] int64.

    The reference's ``y[..., exclude] = -inf`` turns the Python list into an index tensor on the host and
    copies it to the device, a blocking copy that synchronises the host with the stream; here each run of
    consecutive excluded ids is one fill of a column slice instead (decoders exclude a few special ids), and
    the rest is the GEMM and ``argmax``. The same indices as the reference."""
    y = F.linear(x, weight, bias)
    ids = sorted(set(exclude))
    for start, stop in _runs(ids):
        y.narrow(-1, start, stop - start).fill_(float("-inf"))
    return _lowest_allowed_where_none_above_minus_inf(y, y.argmax(-1), ids)


def _lowest_allowed_where_none_above_minus_inf(y: torch.Tensor, index: torch.Tensor,
                                               excluded: Sequence[int]) -> torch.Tensor:
    """``index`` (argmax of logits ``y`` whose excluded columns hold -inf) with the rows whose chosen logit is
    -inf sent to the lowest allowed id. Such a row has no allowed logit above -inf (a NaN would have been
    chosen), so its -inf ties with the excluded columns and argmax's first-of-ties may pick an excluded
    one. One elementwise select on the device: no host synchronisation."""
    if not excluded:
        return index    # argmax's first -inf is id 0, itself allowed
    chosen = y.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    return torch.where(chosen == float("-inf"), _lowest_allowed(excluded), index)


def _lowest_allowed(excluded: Sequence[int]) -> int:
    """The smallest id not in ``excluded`` (sorted, distinct, not every id: checked by the callers)."""
    lowest = 0
    for i in excluded:
        if i != lowest:
            break
        lowest += 1
    return lowest


def _runs(ids: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct ids as [start, stop) runs of consecutive values: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _check_arguments(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fp32: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The prologue of both entry points: (x, weight, bias) checked (and cast under autocast; with ``fp32``, the
    C++ kernels' float32 parameters with bf16 x, ``takes_fp32_params``, float32 ones are passed uncast).

    Unlike the other ops' prologue (``entry_prologue``), leading dimensions of size 0 are accepted, as
    ``nn.Linear`` accepts them: an empty batch gives an empty output (and gradients of the right shapes,
    zero for the parameters); K = 0 is still refused (by the weight's check)."""
    ndim = x.dim() if isinstance(x, torch.Tensor) else 2   # not a tensor: check_tensor's TypeError
    check_tensor("x", x, ndim=ndim)
    check_device("x", x)
    if ndim < 2:
        raise ValueError(f"x must have at least 2 dimensions ([..., K]), got shape {tuple(x.shape)}")
    dtype = autocast_dtype(x.device)
    (x,) = cast_floating(dtype, x)
    weight, bias = (p if fp32 and getattr(p, "dtype", None) == torch.float32 else cast_floating(dtype, p)[0]
                    for p in (weight, bias))
    check_tensor("weight", weight, shape=(None, x.shape[-1]), like=x, or_float32=fp32)
    check_positive("weight", weight, range(2))
    check_optional("bias", bias, shape=(weight.shape[0],), like=x, or_float32=fp32)
    return x, weight, bias


def _check_exclude(exclude: object, features: int) -> list[int]:
    if isinstance(exclude, (str, bytes)) or not isinstance(exclude, Sequence):
        raise TypeError(f"exclude must be a sequence of ints, got {type(exclude).__name__}")
    ids = list(exclude)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"exclude must hold ints, got {type(i).__name__}")
        if not 0 <= i < features:
            raise ValueError(f"exclude holds {i}, outside the {features} output features [0, {features})")
    if len(set(ids)) >= features:
        raise ValueError(f"exclude leaves none of the {features} output features to choose")
    return ids


# The small calls the checks every op gets run (fastqa.ops._declare.Example).
example("linear", lambda d, b: ((d.randn(b, 9, 8), d.randn(6, 8, scale=0.3)), {}), grads=(0, 1))
example("linear_argmax", lambda d, b: ((d.randn(b, 9, 8), d.randn(6, 8, scale=0.3), None, [1]), {}))
