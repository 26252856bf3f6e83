"""Helpers shared by the op tests and the model tests: which backends run here, the one tolerance
table, and comparisons against the reference (``from helpers import assert_close, TOLERANCES``)."""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastqa._backend import cpu_available, triton_usable_here
from tolerances import TABLE


def _train_seed() -> int:
    value = os.environ.get("FASTQA_TEST_SEED", "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"FASTQA_TEST_SEED must be an integer, got {value!r}") from None


# The seed of the toy models the tests train (initial weights, batch order, dropout): 0, or FASTQA_TEST_SEED.
# `make test-numerics` runs the model tests again under another, so no expectation rests on one draw.
TRAIN_SEED = _train_seed()
# The training commands' flag for it (qa-train, mt-train).
SEED_ARGS = ["--seed", str(TRAIN_SEED)]

# The one tolerance table (tests/tolerances.py, torch-free so the GPU check's supervisor reads it too): (atol,
# rtol) per comparison and dtype, the comparisons described there, keyed here by torch.dtype.
TOLERANCES: dict[str, dict[torch.dtype, tuple[float, float]]] = {
    comparison: {getattr(torch, dtype): tol for dtype, tol in row.items()} for comparison, row in TABLE.items()}


def _same_dtype(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) of a result in ``dtype`` against the reference in the same dtype (float32's for other dtypes)."""
    table = TOLERANCES["same dtype"]
    return table.get(dtype, table[torch.float32])


def compiled_backends() -> list[str]:
    """The compiled backends usable here, in the order tests run them: "cpu" where fastqa._C is built,
    "triton" where Triton runs (a CUDA device, or TRITON_INTERPRET=1, which tests/conftest.py sets)."""
    backends = ["cpu"] if cpu_available() else []
    if triton_usable_here():
        importlib.import_module("fastqa.triton_kernels")  # registers torch.ops.fastqa_triton.*
        backends.append("triton")
    return backends


def device_of(backend: str) -> torch.device:
    """The device a backend's tensors live on: CUDA for Triton where there is a GPU, else the CPU."""
    return torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")


def interpreted(backend: str) -> bool:
    """Triton kernels running in the interpreter (slow: tests keep their shapes small there)."""
    return backend == "triton" and not torch.cuda.is_available()


def as_leaves(args: Sequence) -> list:
    """Fresh leaf copies (requires_grad) of the tensors in ``args``; None stays None."""
    return [None if a is None else a.detach().clone().requires_grad_() for a in args]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, name: str,
                 atol: float | None = None, rtol: float | None = None) -> None:
    """torch.testing.assert_close with the worst mismatch's index in the message."""
    default_atol, default_rtol = _same_dtype(expected.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert not torch.isnan(actual).any(), f"{name}: NaN in the result"
    diff = (actual.double() - expected.double()).abs()
    if diff.numel():
        worst = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        where = f"worst |diff| {diff.max().item():.3e} at {worst}: {actual[worst].item()} vs {expected[worst].item()}"
    else:
        where = "empty"
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {where}\n{m}")


def clone_inputs(args: Sequence, requires_grad: Sequence[bool]) -> list:
    """Fresh leaf copies of ``args`` (tensors), keeping their strides, with requires_grad as asked."""
    out = []
    for a, rg in zip(args, requires_grad):
        if isinstance(a, torch.Tensor):
            c = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            c.copy_(a)
            out.append(c.requires_grad_(rg and a.is_floating_point()))
        else:
            out.append(a)
    return out


def check_against_reference(fn: Callable, ref: Callable, args: Sequence, kwargs: dict | None = None, *,
                            names: Sequence[str], grad_args: Sequence[bool] | None = None,
                            grad_out: torch.Tensor | None = None, atol: float | None = None,
                            rtol: float | None = None) -> None:
    """Forward and every gradient of ``fn(*args, **kwargs)`` against ``ref``.

    grad_args: which args get a gradient (default: every floating tensor); grad_out: the upstream
    gradient (default: random, passed as a non-contiguous view to catch stride bugs).
    """
    kwargs = kwargs or {}
    if grad_args is None:
        grad_args = [isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]
    got_in = clone_inputs(args, grad_args)
    ref_in = clone_inputs(args, grad_args)
    got = fn(*got_in, **kwargs)
    want = ref(*ref_in, **kwargs)
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    for i, (g, w) in enumerate(zip(got_t, want_t)):
        assert_close(g, w, name=f"output {i}", atol=atol, rtol=rtol)
    if not any(grad_args):
        return
    if grad_out is None:
        w0 = want_t[0]
        # A transposed copy viewed back: same values layout-wise, non-contiguous strides.
        grad_out = torch.randn(tuple(reversed(w0.shape)), dtype=w0.dtype, device=w0.device).permute(
            *reversed(range(w0.dim())))
    got_grads = torch.autograd.grad(got_t[0], [a for a, rg in zip(got_in, grad_args) if rg], grad_out,
                                    allow_unused=True)
    want_grads = torch.autograd.grad(want_t[0], [a for a, rg in zip(ref_in, grad_args) if rg], grad_out,
                                     allow_unused=True)
    grad_names = [n for n, rg in zip(names, grad_args) if rg]
    for n, g, w in zip(grad_names, got_grads, want_grads):
        if w is None:
            assert g is None or not g.any(), f"grad of {n}: expected none"
            continue
        assert g is not None, f"grad of {n}: missing"
        assert_close(g, w, name=f"grad of {n}", atol=_gradient_atol(w, atol), rtol=rtol)


def check_bf16_against_float64(fn: Callable, ref: Callable, args: Sequence, kwargs: dict | None = None, *,
                               names: Sequence[str], grad_args: Sequence[bool] | None = None,
                               tol: tuple[float, float] | None = None, outputs: int = 1) -> None:
    """Forward and every gradient of ``fn`` on bfloat16 copies of ``args`` against ``ref`` run in float64 on
    the same (rounded) values: the kernel must return bf16 (its first ``outputs`` outputs and every gradient)
    and stay within ``TOLERANCES["vs float64"][bf16]`` (or ``tol``): |got - want| <= atol * max(1,
    max |want|) + rtol * |want|. The upstream gradient is bf16 and non-contiguous."""
    kwargs = kwargs or {}
    atol, rtol = TOLERANCES["vs float64"][torch.bfloat16] if tol is None else tol
    if grad_args is None:
        grad_args = [isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]
    low = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    exact = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in low]
    got_in, ref_in = clone_inputs(low, grad_args), clone_inputs(exact, grad_args)
    got, want = fn(*got_in, **kwargs), ref(*ref_in, **kwargs)
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)

    def close(g: torch.Tensor, w: torch.Tensor, what: str) -> None:
        assert g.dtype == torch.bfloat16, f"{what}: expected bfloat16, got {g.dtype}"
        assert g.shape == w.shape, f"{what}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        scale = max(1.0, float(w.detach().abs().max())) if w.numel() else 1.0
        assert_close(g.double(), w, name=f"{what} (bf16 vs float64)", atol=atol * scale, rtol=rtol)

    for i in range(outputs):
        close(got_t[i], want_t[i], f"output {i}")
    if not any(grad_args):
        return
    w0 = want_t[0]
    grad_out = torch.randn(tuple(reversed(w0.shape)), generator=torch.Generator().manual_seed(1)).to(
        torch.bfloat16).permute(*reversed(range(w0.dim())))
    got_grads = torch.autograd.grad(got_t[0], [a for a, rg in zip(got_in, grad_args) if rg], grad_out,
                                    allow_unused=True)
    want_grads = torch.autograd.grad(want_t[0], [a for a, rg in zip(ref_in, grad_args) if rg], grad_out.double(),
                                     allow_unused=True)
    for n, g, w in zip([n for n, rg in zip(names, grad_args) if rg], got_grads, want_grads):
        if w is None:
            assert g is None or not g.any(), f"grad of {n}: expected none"
            continue
        assert g is not None, f"grad of {n}: missing"
        close(g, w, f"grad of {n}")


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max(1, max |want|), in float64: a low-precision model's distance from its float64
    twin, comparable between implementations."""
    want = want.detach().double()
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    return float((got.detach().double() - want).abs().max()) / scale if want.numel() else 0.0


def _gradient_atol(want: torch.Tensor, atol: float | None) -> float:
    """A gradient's absolute tolerance: the dtype's, or 1/20 of its rtol times the largest |want| when that is
    larger. A weight gradient sums B * L terms; an entry that cancels to near 0 keeps an error of the size of
    its terms (seen: 2.6e-4 on a 0.12 entry of a gradient reaching 365, with BLAS in another order)."""
    default_atol, default_rtol = _same_dtype(want.dtype)
    base = default_atol if atol is None else atol
    if not want.numel() or not want.is_floating_point():
        return base
    return max(base, default_rtol / 20 * float(want.detach().abs().max()))


def kernel_ops(backend: str):
    """The custom-op namespace of a compiled backend: torch.ops.fastqa (C++) or torch.ops.fastqa_triton."""
    return {"cpu": torch.ops.fastqa, "triton": torch.ops.fastqa_triton}[backend]


def ran_ops(call: Callable[[], object]) -> set:
    """The fused kernels (fastqa / fastqa_triton custom ops, by qualified name) ``call()`` ran, as the
    profiler saw them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    return {e.name for e in prof.events() if e.name.startswith(("fastqa::", "fastqa_triton::"))}


def ran_kernels(call: Callable[[], object]) -> bool:
    """Whether ``call()`` ran a fused kernel (a fastqa / fastqa_triton custom op), as the profiler saw it."""
    return bool(ran_ops(call))


@contextlib.contextmanager
def num_threads(n: int):
    """torch's thread count set to n inside the block, the caller's restored after (the tests that hold a kernel's
    results to the same bits on any thread count)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def checks_skipped_in(module: torch.nn.Module) -> list[bool]:
    """Whether each call of ``module`` (from now on) ran inside an ``arguments_checked`` scope: a pre-hook hands
    ``fastqa._checks.check_tensor`` a non-tensor, which only a scope lets through."""
    from fastqa._checks import check_tensor

    seen: list[bool] = []

    def probe(_module: torch.nn.Module, _args: tuple) -> None:
        try:
            check_tensor("probe", None)
            seen.append(True)
        except TypeError:
            seen.append(False)
    module.register_forward_pre_hook(probe)
    return seen


def row_strided(t: torch.Tensor | None) -> torch.Tensor | None:
    """t [..., C] as a slice of a wider tensor: rows C + 3 apart (a row stride of its own), differentiable; None
    stays None."""
    return None if t is None else torch.nn.functional.pad(t, (1, 2))[..., 1:-2]


def padding_mask(B: int, L: int, seed: int = 0) -> torch.Tensor:
    """[B, L] bool with right padding, left padding and a hole (False = padding), every row non-empty."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, L, dtype=torch.bool)
    for b in range(B):
        kind, cut = b % 3, int(torch.randint(1, L, (1,), generator=g))
        if kind == 0:
            mask[b, cut:] = False
        elif kind == 1:
            mask[b, :cut] = False
        else:
            mask[b, cut] = False
    return mask


class HostReads(TorchDispatchMode):
    """Inside it, every op whose result the host must read from the tensor's data is recorded in ``reads``
    (its aten name): on a GPU each would wait for the device (``.item()``, ``int()`` / ``bool()`` of a
    tensor, ``nonzero``, boolean-mask indexing, ``torch.equal``, ``repeat_interleave`` without
    ``output_size``...). It sees the ops of the calling thread, CPU tensors included, so the GPU paths' code
    is checked on the CPU; a custom op counts as one op (what its kernel does inside is its own business).
    ``NoHostReads`` raises at the first one instead."""

    _READS = {"_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero", "_unique", "_unique2",
              "unique_dim", "unique_consecutive", "masked_scatter", "argwhere"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def _read(self, what: str) -> None:
        self.reads.append(what)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in self._READS:
            self._read(f"aten.{name}")
        elif name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and kwargs.get("output_size") is None \
                and (len(args) < 4 or args[3] is None) and not isinstance(args[1] if len(args) > 1 else None, int):
            self._read("aten.repeat_interleave without output_size")
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                self._read(f"aten.{name} with a boolean mask")
        return func(*args, **kwargs)


class NoHostReads(HostReads):
    """``HostReads`` that raises AssertionError naming the first host read."""

    def _read(self, what: str) -> None:
        raise AssertionError(f"host read of a tensor's data: {what}")


def fp64_dot_skip_reason() -> str | None:
    """Why the Triton kernels' float64 ``tl.dot`` paths cannot run here, or None when they can. Triton builds
    differ (some reject fp64 dot operands on some GPUs), so this compiles and runs one tiny fp64 dot, once
    per process; the interpreter always can."""
    return _fp64_dot_skip_reason()


@functools.lru_cache(maxsize=None)
def _fp64_dot_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return None if triton_usable_here() else "triton cannot run here"
    from _fp64_dot_probe import probe
    try:
        return probe()
    except Exception as exc:  # any compile or launch failure of the probe is the reason to skip
        return f"this Triton ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}) cannot " \
               f"compile a float64 tl.dot on this GPU"


def load_script(path: Path) -> ModuleType:
    """A script of scripts/ imported as a module named after its file, or a package of scripts/ (a folder)
    after its folder, its modules importable under it (their functions tested directly)."""
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(path.name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module
