"""Argument checks shared by the package: every message names the argument and what was expected.

The scalar checks (``check_int``, ``check_number``, ``check_bool``, ``check_choice``) are the package's one way
to check an int, a number or a flag argument: a bool is never an int or a number (True is an int to
``isinstance``), a wrong type is a TypeError, a value out of range a ValueError. The tensor checks serve the ops.

No torch at import time (the tensor checks import it when called): the command line's parser and
``fastqa.serve.limits`` check their values here without loading torch.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch


class _Scope(threading.local):
    depth = 0   # per thread: the arguments_checked() scopes open on it (a class default: every thread starts at 0)


_SCOPE = _Scope()


def arguments_checked() -> contextlib.AbstractContextManager:
    """A scope, on this thread, in which the checks of this module pass their values through unchecked.

    A model's entry (``QANet.forward``, ``ConvS2S.encode``, a decoding search...) checks its own inputs and then
    runs its layers inside one: every argument of every op below is built by the model from those inputs and its
    parameters, so the op-level checks would only repeat, once per call and a few hundred times per step, what
    holds by construction. A layer or op called on its own (outside any scope) still checks everything, and other
    threads are unaffected. Scopes nest. While ``torch.compile`` traces, the scope is empty (the checks then run
    on symbolic values, as everywhere else, and the traced graph holds none of them)."""
    return contextlib.nullcontext() if _compiling() else _CheckedScope()


class _CheckedScope:
    def __enter__(self) -> None:
        _SCOPE.depth += 1

    def __exit__(self, *exc: object) -> None:
        _SCOPE.depth -= 1


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    floating: bool = True,
    dtype: torch.dtype | None = None,
    like: torch.Tensor | None = None,
    or_float32: bool = False,
) -> torch.Tensor:
    """Validate ``t`` and return it.

    shape: expected sizes, None for "any"; like: a tensor whose device (and, for floating tensors,
    dtype) ``t`` must share; or_float32: float32 is accepted too (a parameter of a kernel that takes float32
    parameters with 16-bit activations, ``entry_prologue``'s ``fp32_params``).
    """
    if _SCOPE.depth:
        return t
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if ndim is None and shape is not None:
        ndim = len(shape)
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(t.shape, shape)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name} must have shape {_fmt_shape(shape)}, got {tuple(t.shape)} (dimension {axis})")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name} must be on {like.device} like the input, got {t.device}")
        if floating and t.dtype != like.dtype and not (or_float32 and t.dtype == torch.float32):
            raise TypeError(f"{name} must have dtype {like.dtype} like the input, got {t.dtype}")
    return t


def check_dense(name: str, t: torch.Tensor) -> None:
    """A plain strided tensor: sparse, nested, quantized and other non-strided tensors (mkldnn, ...)
    have no data the kernels can read (and torch's own errors about them name no argument)."""
    import torch

    if t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got a nested tensor")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.is_quantized:
        raise TypeError(f"{name} must be a dense floating-point tensor, got a quantized tensor ({t.dtype})")


def check_optional(name: str, t: object, **kwargs) -> torch.Tensor | None:
    return None if t is None else check_tensor(name, t, **kwargs)


def check_nonempty_batch(name: str, t: torch.Tensor) -> None:
    if not _SCOPE.depth and t.shape[0] == 0:
        raise ValueError(f"{name} must have a non-empty batch, got shape {tuple(t.shape)}")


def check_positive(name: str, t: torch.Tensor, axes: Sequence[int]) -> None:
    if _SCOPE.depth:
        return
    for axis in axes:
        if t.shape[axis] == 0:
            raise ValueError(f"{name} must have a non-zero size in dimension {axis}, got shape {tuple(t.shape)}")


def _fmt_shape(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels need data: a meta (or other data-less) tensor would otherwise slip through to the
    reference as an automatic fallback."""
    if not _SCOPE.depth and t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a CPU or CUDA tensor, got a tensor on {t.device}")


# ------------------------------------------------------------------------------------------------
# Scalar arguments
# ------------------------------------------------------------------------------------------------

def check_int(name: str, value: object, *, low: int | None = None, high: int | None = None,
              expected: str | None = None, error: type[Exception] | None = None) -> int:
    """``value`` as an int: any ``numbers.Integral`` but a bool (numpy's ints too), within [low, high].

    A wrong type is a TypeError, a value out of range a ValueError, both "``name`` must be ``expected``, got
    ...": ``expected`` defaults to "an int", "an int >= low", "an int <= high" or "an int in [low, high]".
    ``error``: the class to raise for either instead (a caller whose contract is one ValueError, or a
    UserError, for any bad value).
    """
    if _SCOPE.depth or _compiling():
        return value  # type: ignore[return-value]
    expected = _expected_type(name, value, numbers.Integral, "an int", (low, high, False, False), expected, error)
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise (error or ValueError)(f"{name} must be {expected}, got {value}")
    return value


def check_number(name: str, value: object, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, expected: str | None = None,
                 error: type[Exception] | None = None) -> float:
    """``value`` as a float: any ``numbers.Real`` but a bool, never NaN, within the bounds given (closed
    unless ``low_open`` / ``high_open``; ``high=math.inf, high_open=True`` refuses infinity).

    A wrong type is a TypeError, NaN or a value out of range a ValueError, both "``name`` must be
    ``expected``, got ...": ``expected`` defaults to "a number", "a number >= low", "a number > low",
    "a number in [low, high)"... ``error``: the class to raise for either instead (see ``check_int``).
    """
    if _SCOPE.depth or _compiling():
        return value  # type: ignore[return-value]
    expected = _expected_type(name, value, numbers.Real, "a number", (low, high, low_open, high_open), expected,
                              error)
    value = float(value)
    if (math.isnan(value)
            or (low is not None and (value <= low if low_open else value < low))
            or (high is not None and (value >= high if high_open else value > high))):
        raise (error or ValueError)(f"{name} must be {expected}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value``, a bool (not 0 / 1, not a numpy bool)."""
    if _SCOPE.depth or _compiling():
        return value  # type: ignore[return-value]
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _expected_type(name: str, value: object, kind: type, noun: str, bounds: tuple, expected: str | None,
                   error: type[Exception] | None) -> str:
    """What ``value`` must be ("``noun``" and its ``bounds``, (low, high, low_open, high_open), unless
    ``expected`` says), once it is a ``kind`` and not a bool (else the TypeError, or ``error``, saying so)."""
    if expected is None:
        expected = noun + _bounds(*bounds)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise (error or TypeError)(f"{name} must be {expected}, got {type(value).__name__}")
    return expected


def _compiling() -> bool:
    """Whether ``torch.compile`` is tracing the caller. The scalar checks then pass their value through: Dynamo
    traces an int or float argument as a symbol (``dynamic=True``), which ``math.isnan`` and the comparisons
    cannot take (a compiled caller's scalars go unchecked; the eager call checks them). Without torch
    loaded nothing can be compiling (the command line checks its flags here before torch loads)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The bounds in words: " >= 1", " < 5", " in (0, 1]"...; "" without any."""
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def check_text(what: str, text: str, *, at: str = "", where: str = "", blank: bool = False,
               undecodable: str | None = None) -> str:
    """``text``, when it is text a model can read; else a UserError naming ``what`` ("the context"), with ``at``
    before it ("--context: ", "q.jsonl: line 2: ") and ``where`` after it (" (pair 3)"). The one text check of
    every way text comes in (the Python API, a command line, a question file, an HTTP request):

    - lone surrogates (bytes that were not UTF-8, decoded leniently): no tokenizer can take them. Text from a
      command line (``undecodable``: what to do instead) is described as the bytes it was;
    - with ``blank``, nothing but whitespace (no token to read): "the context is empty".
    """
    from .errors import UserError

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        if undecodable is not None:
            raise UserError(f"{at}not valid UTF-8 text (an undecodable byte at character {e.start}); "
                            f"{undecodable}") from None
        raise UserError(f"{at}{what} is not valid Unicode text (a lone surrogate at character {e.start}){where}") from None
    if blank and not text.strip():
        raise UserError(f"{at}{what} is empty{where}")
    return text


def check_choice(name: str, value: object, choices: Sequence[str | None]) -> None:
    """``value`` is one of the strings (or None) in ``choices``; anything else (a tensor too) raises."""
    if not _SCOPE.depth and not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


# ------------------------------------------------------------------------------------------------
# The prologue of every functional entry point
# ------------------------------------------------------------------------------------------------

def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype ``torch.autocast`` asks for on ``device``, or None outside an autocast region.

    Custom ops are invisible to autocast, so the functional entries apply it themselves: under
    autocast, floating inputs run in the autocast dtype, as nn.Conv1d / matmul would.
    """
    import torch

    if device.type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def cast_floating(dtype: torch.dtype | None, *tensors: torch.Tensor | None) -> tuple:
    """``tensors`` with every floating one cast to ``dtype`` (None: unchanged).

    A leaf tensor (a parameter) is cast once per forward, not per call: its cast is reused while a graph holds it
    and the leaf is unchanged (``_cached_cast``), as autocast's own weight cache does for torch's ops. An activation (not a leaf) is
    cast where it is not in ``dtype`` already."""
    if dtype is None:
        return tensors
    return tuple(_cached_cast(t, dtype) if t is not None and t.is_floating_point() and t.dtype != dtype else t
                 for t in tensors)


_CASTS: dict | None = None
"""leaf tensor -> (key, a weak reference to its cast): ``_cached_cast``'s cache (a
``torch.utils.weak.WeakIdKeyDictionary``, made on first use: no torch at import)."""


def _cached_cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``, reused for a leaf while the cast is alive and the leaf's version (an optimizer step, a
    ``copy_``, a state_dict load bump it), storage, grad mode and inference mode are the ones it was cast under.

    The cache holds weak references only: a cast lives as long as the autograd graph that saved it, so every
    call of one training forward shares one cast of each weight -- and one conversion of its summed gradient
    back to the parameter's dtype -- and the next step casts the updated weights anew (the weight cache of
    autocast lives as long as its region). A strong reference would keep the parameter alive through the
    cast's graph, and would outlive changes made through ``.data``, which no version counter sees. Never
    cached while ``torch.compile`` traces (the graph holds the cast) or a CUDA graph is captured (a replay
    must cast the weights the captured optimizer step updated)."""
    global _CASTS
    import torch

    if (not t.is_leaf or torch.compiler.is_compiling()
            or (t.is_cuda and torch.cuda.is_current_stream_capturing())):
        return t.to(dtype)
    if _CASTS is None:
        from torch.utils.weak import WeakIdKeyDictionary

        _CASTS = WeakIdKeyDictionary()
    key = (t._version, t.data_ptr(), dtype, t.requires_grad and torch.is_grad_enabled(),
           torch.is_inference_mode_enabled())
    entry = _CASTS.get(t)
    cast = entry[1]() if entry is not None and entry[0] == key else None
    if cast is None:
        cast = t.to(dtype)
        _CASTS[t] = (key, weakref.ref(cast))
    return cast


def entry_prologue(name: str, first: object, ndim: int, *others: object, params: int = 0,
                   fp32_params: bool = False) -> tuple:
    """What every functional entry point does first, in this order: ``first`` (the activation whose
    device and dtype the others must share) must be a floating tensor of rank ``ndim`` on a CPU or
    CUDA device; under autocast, ``first`` and the floating ``others`` are cast to the autocast dtype;
    then ``first`` must have a non-empty batch and non-zero sizes in every other dimension.

    params: the last ``params`` of ``others`` are the op's parameters; with ``fp32_params`` (the backend's
    kernels take float32 parameters with 16-bit activations and round them as they load them) a float32
    parameter is not cast under autocast: the master weights go in as they are, with no copy per call, and
    their gradients come back in float32. The caller then checks them with ``or_float32``.

    Returns (first, *others), cast. The others are checked by the caller, after the cast, so that
    their dtypes are compared as the kernels will see them.
    """
    check_tensor(name, first, ndim=ndim)
    check_device(name, first)
    dtype = autocast_dtype(first.device)
    if fp32_params and dtype is not None and params:
        split = len(others) - params
        float32 = sys.modules["torch"].float32
        cast = (*cast_floating(dtype, first, *others[:split]),
                *(p if getattr(p, "dtype", None) == float32 else cast_floating(dtype, p)[0] for p in others[split:]))
    else:
        cast = cast_floating(dtype, first, *others)
    check_nonempty_batch(name, cast[0])
    check_positive(name, cast[0], range(1, ndim))
    return cast
