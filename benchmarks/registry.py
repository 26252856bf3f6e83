"""The pluggable case registry.

A *case* is one workload at one shape (e.g. ``dwsep_conv1d`` at B=32, L=400, C=128, K=7). For each
of its modes it is *prepared* into a :class:`Prepared`: one zero-argument callable per
implementation (all fed the same inputs), the ground truth their results are compared against,
and the FLOPs and bytes that give the lower bound. The runner only ever sees ``Prepared`` objects,
so a model case (a QANet train step, a ConvS2S greedy translation) is one more :class:`Case`
subclass whose ``prepare`` builds its runners -- ``register(MyModelCase(...))`` and it is timed,
tabled and charted like the ops.

:class:`OpCase` covers the functional ops: it builds the naive, eager, compiled and fastqa-backend
implementations from the reference function, and the ``fwd`` / ``fwd+bwd`` runners around them.
"""
from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

import torch

MODES = ("fwd", "fwd+bwd")
# Display order of the implementations; a case may offer any subset.
IMPL_ORDER = ("naive", "eager", "compiled", "fastqa[cpu]", "fastqa[triton]")


@dataclass
class Prepared:
    """One (case, mode) ready to run.

    runners: impl -> callable running the workload once and returning its result (tensors), which
    is compared with ``expected`` (or, when the impls are different models, ``expected[impl]``).
    unavailable: impl -> why it is not run here (printed, recorded). compiled: the impls whose first call
    compiles (their first-call time is reported apart). baseline: the impl the speedups are over.
    """
    runners: dict[str, Callable[[], Any]]
    expected: Any
    flops: float
    bytes: float
    unavailable: dict[str, str] = field(default_factory=dict)
    compiled: frozenset[str] = frozenset()
    baseline: str = "eager"

    def expected_of(self, impl: str) -> Any:
        """What ``impl``'s result is checked against."""
        return self.expected[impl] if isinstance(self.expected, dict) else self.expected


class Case(ABC):
    """A registered workload. ``quick`` cases make up ``--quick`` runs; model cases (a whole train step or
    translation: minutes per case) run only when asked for (``--models``, or named by ``--ops``/``--cases``)."""
    model_case: ClassVar[bool] = False
    op: str
    name: str
    shape: dict[str, Any]
    modes: tuple[str, ...] = MODES
    quick: bool = False

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"

    @abstractmethod
    def prepare(self, mode: str, device: torch.device, dtype: torch.dtype, *, compile: bool,
                naive_limit_bytes: float) -> Prepared:
        """Allocate inputs on ``device`` and build the runners of ``mode``."""


@dataclass
class OpInputs:
    """Positional args, keyword args, and which of them get a gradient in ``fwd+bwd`` (an int is
    a positional index, a str a keyword)."""
    args: tuple
    kwargs: dict[str, Any]
    grad: tuple[int | str, ...]

    def to(self, device: torch.device, dtype: torch.dtype) -> "OpInputs":
        def move(a: Any) -> Any:
            if not isinstance(a, torch.Tensor):
                return a
            return a.to(device, dtype) if a.is_floating_point() else a.to(device)
        return OpInputs(tuple(move(a) for a in self.args), {k: move(v) for k, v in self.kwargs.items()},
                        self.grad)


def _fastqa_backends(device: torch.device) -> tuple[list[str], str | None]:
    """fastqa backends worth timing on ``device`` (never the Triton interpreter), or why none."""
    try:
        from fastqa import _backend
    except ImportError as exc:  # fastqa itself broken: the references still run
        return [], f"fastqa is not importable ({exc})"
    if device.type == "cpu":
        return (["cpu"], None) if _backend.cpu_available() else ([], "the C++ extension is not built")
    if device.type == "cuda":
        return (["triton"], None) if _backend.triton_available(device) else ([], "triton is not installed")
    return [], f"no fastqa backend for {device.type}"


def _as_list(tensors: Any) -> list[torch.Tensor]:
    return list(tensors) if isinstance(tensors, (tuple, list)) else [tensors]


def max_abs_err(got: Any, expected: Any) -> float:
    """Largest |got - expected| over every tensor of the two results (output, then gradients)."""
    got_t, exp_t = _as_list(got), _as_list(expected)
    if len(got_t) != len(exp_t):
        raise ValueError(f"result has {len(got_t)} tensors, expected {len(exp_t)}")
    err = 0.0
    for g, e in zip(got_t, exp_t):
        if g.shape != e.shape:
            raise ValueError(f"result shape {tuple(g.shape)} != expected {tuple(e.shape)}")
        if g.numel():
            err = max(err, (g.detach().double() - e.detach().double().to(g.device)).abs().max().item())
    return err


def op_runner(fn: Callable, inputs: OpInputs, mode: str, grad_out: torch.Tensor | None) -> Callable[[], Any]:
    """Run ``fn(*args, **kwargs)`` once: under no_grad (fwd), or forward plus the input gradients."""
    if mode == "fwd":
        def run_fwd() -> Any:
            with torch.no_grad():
                return fn(*inputs.args, **inputs.kwargs)
        return run_fwd
    def leaf(key: int | str, a: Any) -> Any:
        return a.detach().requires_grad_(key in inputs.grad) if isinstance(a, torch.Tensor) else a
    args = [leaf(i, a) for i, a in enumerate(inputs.args)]
    kwargs = {k: leaf(k, v) for k, v in inputs.kwargs.items()}
    leaves = [args[g] if isinstance(g, int) else kwargs[g] for g in inputs.grad]

    def run_fwd_bwd() -> Any:
        out = fn(*args, **kwargs)
        # autograd.grad, not .backward(): nothing accumulates into .grad between timed runs.
        return (out.detach(), *torch.autograd.grad(out, leaves, grad_out))
    return run_fwd_bwd


@dataclass
class OpCase(Case):
    """A functional op at one shape.

    make_inputs(generator) -> OpInputs on the CPU in float64 (moved and cast by ``prepare``, so every
    device and dtype sees the same values). reference: the eager reference op -- what torch.compile
    compiles and what ``fastqa.<fastqa_fn>`` replaces. program(op) -> the timed callable built
    around an op (default: the op itself; the decoding case wraps a step op in a 50-step loop).
    naive: the tutorials' full program, run when naive_bytes(mode) (its estimated peak memory at
    float32) fits. flops(mode): the work of the case, the same for every implementation.
    """
    op: str
    name: str
    shape: dict[str, Any]
    make_inputs: Callable[[torch.Generator], OpInputs]
    reference: Callable
    fastqa_fn: str
    flops: Callable[[str], float]
    program: Callable[[Callable], Callable] = lambda op: op
    naive: Callable | None = None
    naive_bytes: Callable[[str], float] | None = None
    modes: tuple[str, ...] = MODES
    quick: bool = False

    def implementations(self, device: torch.device, dtype: torch.dtype, mode: str, *, compile: bool,
                        naive_limit_bytes: float) -> tuple[dict[str, Callable], dict[str, str]]:
        impls: dict[str, Callable] = {}
        unavailable: dict[str, str] = {}
        if self.naive is not None:
            need = self.naive_bytes(mode) * dtype.itemsize / 4 if self.naive_bytes else 0.0
            if need <= naive_limit_bytes:
                impls["naive"] = self.naive
            else:
                unavailable["naive"] = f"needs ~{need / 2**30:.1f} GiB > limit {naive_limit_bytes / 2**30:.1f} GiB"
        impls["eager"] = self.program(self.reference)
        if compile:
            impls["compiled"] = self.program(torch.compile(self.reference, dynamic=False))
        backends, why = _fastqa_backends(device)
        import fastqa
        op_fn = getattr(fastqa, self.fastqa_fn, None)
        if op_fn is None:
            unavailable["fastqa"] = f"fastqa.{self.fastqa_fn} is not in this build yet"
        elif why is not None:
            unavailable["fastqa"] = why
        for b in backends if op_fn is not None else []:
            impls[f"fastqa[{b}]"] = self.program(functools.partial(op_fn, backend=b))
        return impls, unavailable

    def prepare(self, mode: str, device: torch.device, dtype: torch.dtype, *, compile: bool,
                naive_limit_bytes: float) -> Prepared:
        gen = torch.Generator().manual_seed(0)
        base = self.make_inputs(gen)
        truth_in = base.to(device, torch.float64)
        truth_fwd = op_runner(self.program(self.reference), truth_in, "fwd", None)()
        grad_out = None
        if mode == "fwd+bwd":
            grad_out = torch.randn(truth_fwd.shape, generator=gen, dtype=torch.float64).to(device)
        expected = op_runner(self.program(self.reference), truth_in, mode, grad_out)()
        inputs = base.to(device, dtype)
        impls, unavailable = self.implementations(device, dtype, mode, compile=compile,
                                                  naive_limit_bytes=naive_limit_bytes)
        g = None if grad_out is None else grad_out.to(dtype)
        return Prepared(
            runners={k: op_runner(fn, inputs, mode, g) for k, fn in impls.items()},
            expected=expected, flops=self.flops(mode), bytes=_min_bytes(inputs, truth_fwd, mode, dtype),
            unavailable=unavailable, compiled=frozenset({"compiled"} & impls.keys()))


def _min_bytes(inputs: OpInputs, out: torch.Tensor, mode: str, dtype: torch.dtype) -> float:
    """Compulsory memory traffic: read every input and write the output once (fwd); the backward
    reads the inputs and the output gradient again and writes one gradient per differentiable input."""
    def nbytes(a: Any) -> int:
        return a.numel() * a.element_size() if isinstance(a, torch.Tensor) else 0
    ins = sum(nbytes(a) for a in (*inputs.args, *inputs.kwargs.values()))
    out_b = out.numel() * dtype.itemsize
    if mode == "fwd":
        return float(ins + out_b)
    grads = sum(nbytes(inputs.args[g] if isinstance(g, int) else inputs.kwargs[g]) for g in inputs.grad)
    return float(2 * ins + 2 * out_b + grads)


CASES: list[Case] = []


def register(case: Case) -> Case:
    """Add a case (op or model) to the registry; ids must be unique."""
    if any(c.id == case.id for c in CASES):
        raise ValueError(f"case {case.id} is already registered")
    CASES.append(case)
    return case


def select(ops: Sequence[str] | None = None, cases: Sequence[str] | None = None,
           quick: bool = False, models: bool = False) -> list[Case]:
    """Registered cases filtered by op name (exact), case (substring of the id) and the quick flag; model
    cases only with ``models`` or when ``ops``/``cases`` name them."""
    known = {c.op for c in CASES}
    for op in ops or ():
        if op not in known:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(sorted(known))}")
    return [c for c in CASES
            if (not ops or c.op in ops)
            and (not cases or any(s in c.id for s in cases))
            and (c.quick or not quick)
            and (not c.model_case or models or bool(ops) or bool(cases))]
