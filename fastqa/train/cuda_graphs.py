"""Whole-step CUDA graphs for training: forward, backward, gradient clipping and the optimizer step captured
as one graph per length bucket, and replayed.

On a GPU the eager step waits for Python: every launch is issued by the host, so the step takes as long as
the host takes to issue it. A replayed graph issues the whole step at once. What a graph needs, and how
``GraphedTrainStep`` gives it:

- Fixed shapes: a batch is padded up to a **bucket** (``BucketPlan``): a few lengths per padded dimension
  (contexts and questions, source and target sentences), taken at quantiles of the first epoch's batches.
  The task pads (``pad_batch``); its masks keep the padding out of the loss. A graph is keyed by the batch's
  rows and its bucket; the buckets share one memory pool (one graph replays at a time).
- Fixed addresses: the inputs are copied into **static buffers** (from pinned memory, asynchronously), the
  gradients are zeroed in place (never set to None: the graphs accumulate into them), the optimizer keeps its
  state in place (``Adam(capturable=True)``), and the learning rate is a device tensor the schedule fills in
  place (``prepare_optimizer``) -- a Python float would be baked into the graph.
- No host read in the step: gradient clipping is ``clip_grad_norm_``'s (the norm and the scale stay on the
  device); the dropout seeds live on the device (``fastqa.ops``).
- Warm-up before capture: a key's first ``warmup`` batches run eagerly through its static buffers on a side
  stream (lazy initialisation, Triton autotuning, the optimizer's state); the next one is captured, and every
  later one replays. A capture that fails leaves that key eager (one log line).
- Anything a graph cannot hold runs the same step eagerly, logged once: a batch no bucket holds, keys past
  ``max_graphs``.

On the CPU there is nothing to capture: the same static-buffer step runs eagerly (``capture=False``). That
is what the tests check without a GPU -- bucket choice, static buffers, the in-place optimizer state, the
device learning rate and the fallback -- and the losses equal the plain loop's (padding changes no loss).

A task opts into padding with two methods (a task without them is keyed by its batches' exact shapes, and
nothing is padded):

    graph_lengths(indices) -> tuple[int, ...]   the batch's lengths along its padded dimensions
    pad_batch(batch, lengths) -> batch          the collated batch padded up to those lengths
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BucketPlan", "GraphedTrainStep", "for_run", "length_buckets", "pad_dim", "plan_for", "prepare_optimizer",
           "supports_graphs"]

log = logging.getLogger("fastqa.train")

#: Graphs one run captures at most (each holds its own static inputs; the pool is shared).
MAX_GRAPHS = 16
#: Eager runs of a key through its static buffers before its graph is captured.
WARMUP = 2


# ------------------------------------------------------------------------------------------------- buckets

def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def length_buckets(lengths: Iterable[int], count: int = 3, multiple: int = 8) -> tuple[int, ...]:
    """A few lengths that hold every one of ``lengths``: the values at the quantiles 1/count, 2/count, ... 1,
    rounded up to a multiple of ``multiple`` (tensor-core friendly), without repeats, ascending."""
    values = sorted(int(v) for v in lengths)
    if not values:
        raise ValueError("length_buckets needs at least one length")
    if count < 1 or multiple < 1:
        raise ValueError(f"count and multiple must be >= 1, got {count} and {multiple}")
    picks = {_round_up(max(values[max(math.ceil(len(values) * (i + 1) / count) - 1, 0)], 1), multiple)
             for i in range(count)}
    return tuple(sorted(picks))


@dataclass(frozen=True)
class BucketPlan:
    """Per padded dimension its bucket lengths, ascending. ``bucket(lengths)``: the smallest bucket that
    holds a batch of those lengths, per dimension, or None when one is longer than every bucket."""

    lengths: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        for dim in self.lengths:
            if not dim or list(dim) != sorted(set(dim)) or dim[0] < 1:
                raise ValueError(f"bucket lengths must be ascending positive integers, got {dim}")

    @classmethod
    def of(cls, batch_lengths: Sequence[Sequence[int]], count: int = 3, multiple: int = 8) -> "BucketPlan":
        """The plan for batches of these lengths (one tuple per batch, one length per padded dimension)."""
        if not batch_lengths:
            raise ValueError("BucketPlan.of needs the lengths of at least one batch")
        dims = len(batch_lengths[0])
        return cls(tuple(length_buckets((b[d] for b in batch_lengths), count, multiple) for d in range(dims)))

    def bucket(self, lengths: Sequence[int]) -> tuple[int, ...] | None:
        if len(lengths) != len(self.lengths):
            raise ValueError(f"expected {len(self.lengths)} lengths, got {len(lengths)}")
        out = []
        for value, choices in zip(lengths, self.lengths):
            fit = next((c for c in choices if c >= value), None)
            if fit is None:
                return None
            out.append(fit)
        return tuple(out)


def pad_dim(t: torch.Tensor, dim: int, length: int, value: int | float) -> torch.Tensor:
    """t padded with ``value`` at the end of dimension ``dim`` up to ``length`` (t itself when it has it)."""
    missing = length - t.shape[dim]
    if missing < 0:
        raise ValueError(f"cannot pad dimension {dim} of length {t.shape[dim]} down to {length}")
    if missing == 0:
        return t
    widths = [0, 0] * (t.dim() - dim % t.dim() - 1) + [0, missing]
    return F.pad(t, widths, value=value)


# ---------------------------------------------------------------------------------- batches as tensor lists

def _tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch: a tensor, a tuple/list of them, or a dataclass (other fields are kept)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in _tensors(item)]
    if dataclasses.is_dataclass(batch):
        return [getattr(batch, f.name) for f in dataclasses.fields(batch)
                if isinstance(getattr(batch, f.name), torch.Tensor)]
    return []


def _with_tensors(batch: Any, tensors: Iterable[torch.Tensor]) -> Any:
    """``batch`` with its tensors (in ``_tensors``' order) replaced by ``tensors``."""
    it = iter(tensors)

    def rebuild(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return next(it)
        if isinstance(item, (tuple, list)):
            return type(item)(rebuild(x) for x in item)
        if dataclasses.is_dataclass(item):
            return dataclasses.replace(item, **{f.name: next(it) for f in dataclasses.fields(item)
                                                if isinstance(getattr(item, f.name), torch.Tensor)})
        return item
    return rebuild(batch)


# ---------------------------------------------------------------------------------------- the optimizer

def supports_graphs(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer can step inside a graph: it has a ``capturable`` mode (Adam, AdamW, ...)."""
    return "capturable" in optimizer.defaults


def prepare_optimizer(optimizer: torch.optim.Optimizer, device: torch.device, graphed: bool) -> None:
    """Put the optimizer in the mode the step needs, whatever mode its checkpoint was saved in.

    graphed: each group's learning rate a 0-d tensor on ``device`` (the schedule fills it in place:
    ``LRScheduler`` writes into a tensor rate), and on CUDA ``capturable`` with the step counters on the
    device (no host read in the step). The CPU's rate is float64, as a Python float: the CPU optimizer then
    takes the same steps as the plain loop's, bit for bit; CUDA's capturable step computes in float32.
    Not graphed: Python floats and the counters on the host (as ``torch.optim`` makes them)."""
    capturable = graphed and device.type == "cuda"
    for group in optimizer.param_groups:
        lr = group["lr"]
        value = float(lr) if isinstance(lr, torch.Tensor) else lr
        if graphed:
            dtype = torch.float32 if device.type == "cuda" else torch.float64
            group["lr"] = torch.tensor(value, dtype=dtype, device=device)
        else:
            group["lr"] = value
        if "capturable" in group:
            group["capturable"] = capturable
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = step.to(p.device if capturable else "cpu")


# ---------------------------------------------------------------------------------------- the graphed step

@dataclass
class _Entry:
    """One key's static inputs, its loss output, how often it ran eagerly, and its graph once captured."""

    inputs: Any
    loss: torch.Tensor
    runs: int = 0
    graph: Any = None
    failed: bool = False


class GraphedTrainStep:
    """The training step through static buffers, one entry per (rows, bucket); captured and replayed on CUDA.

    task: the ``fastqa.train.loop.Task`` (its ``collate``, ``loss`` and optionally ``graph_lengths`` /
    ``pad_batch``); model: the module ``task.loss`` calls (not DDP-wrapped); optimizer: prepared with
    ``prepare_optimizer(..., graphed=True)``; scheduler: stepped after each step (it fills the rate in place);
    plan: the buckets (None: keyed by exact shapes, nothing padded); clip_norm: the global gradient norm's
    bound; amp_dtype: the autocast dtype (None: fp32); capture: capture graphs (default: on CUDA).
    """

    def __init__(self, task: Any, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, *,
                 device: torch.device, plan: BucketPlan | None, clip_norm: float | None = None,
                 amp_dtype: torch.dtype | None = None, capture: bool | None = None, warmup: int = WARMUP,
                 max_graphs: int = MAX_GRAPHS) -> None:
        self.task, self.model, self.optimizer, self.scheduler = task, model, optimizer, scheduler
        self.device, self.plan, self.clip_norm, self.amp_dtype = device, plan, clip_norm, amp_dtype
        self.capture = device.type == "cuda" if capture is None else bool(capture)
        if self.capture and device.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA device, got {device}")
        self.warmup, self.max_graphs = max(int(warmup), 1), int(max_graphs)
        self.entries: dict[tuple, _Entry] = {}
        self.pool: Any = None
        self.eager_steps = 0        # steps that ran the plain eager step (no key, or past max_graphs)
        self.replays = 0
        self._said: set[str] = set()
        self.capture_errors: list[str] = []   # why a key's capture failed (that key runs eagerly)
        self._params = [p for p in model.parameters() if p.requires_grad]

    # -- what a step runs
    def _body(self, batch: Any) -> torch.Tensor:
        """Zero the gradients in place, forward, backward, clip, step: the captured region."""
        self.optimizer.zero_grad(set_to_none=False)
        # No autocast cache: a cached cast made during capture would be freed into the graph's pool.
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None,
                            cache_enabled=False):
            loss = self.task.loss(self.model, batch)
        loss.backward()
        if self.clip_norm is not None:
            nn.utils.clip_grad_norm_(self._params, self.clip_norm)  # norm and scale on the device: no host read
        self.optimizer.step()
        return loss.detach()

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message, *args)

    def _key(self, indices: list[int], batch: Any) -> tuple[tuple | None, Any]:
        """(the graph key or None, the batch padded to it)."""
        lengths_of = getattr(self.task, "graph_lengths", None)
        if self.plan is None or lengths_of is None:
            return (len(indices), *(tuple(t.shape) for t in _tensors(batch))), batch
        lengths = tuple(lengths_of(indices))
        bucket = self.plan.bucket(lengths)
        if bucket is None:
            self._once("no-bucket", "cuda graphs: a batch of lengths %s fits no bucket (%s): it runs eagerly, as "
                       "will any other such batch", lengths, self.plan.lengths)
            return None, batch
        return (len(indices), *bucket), self.task.pad_batch(batch, bucket)

    def step(self, indices: list[int]) -> torch.Tensor:
        """One optimizer step on the examples ``indices``; returns the loss as a float64 device scalar (the
        host does not wait for it)."""
        batch = self.task.collate(indices, torch.device("cpu"))
        key, padded = self._key(indices, batch)
        entry = self.entries.get(key) if key is not None else None
        if entry is None and key is not None:
            if len(self.entries) < self.max_graphs:
                entry = self.entries[key] = self._new_entry(padded)
            else:
                self._once("max-graphs", "cuda graphs: %d keys already hold static buffers; batches of new shapes "
                           "run eagerly", self.max_graphs)
        if entry is None:
            loss = self._eager(batch)
        else:
            self._fill(entry, padded)
            loss = self._run(entry, key)
        if self.scheduler is not None:
            self.scheduler.step()
        return loss

    def _new_entry(self, padded: Any) -> _Entry:
        statics = [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in _tensors(padded)]
        return _Entry(inputs=_with_tensors(padded, statics), loss=torch.zeros((), device=self.device))

    def _fill(self, entry: _Entry, padded: Any) -> None:
        """Copy the padded batch into the entry's static buffers (from pinned memory, not waiting, on CUDA)."""
        for static, t in zip(_tensors(entry.inputs), _tensors(padded)):
            if self.device.type == "cuda":
                static.copy_(t.pin_memory(), non_blocking=True)
            else:
                static.copy_(t)

    def _eager(self, batch: Any) -> torch.Tensor:
        self.eager_steps += 1
        return self._body(_with_tensors(batch, [t.to(self.device, non_blocking=True) for t in _tensors(batch)])
                          ).double()

    def _replay(self, entry: _Entry) -> None:
        entry.graph.replay()
        self.replays += 1
        # A replay updates the weights in place without torch seeing it: their version counters stay put, and
        # whatever is keyed on them (a cast or a packed layout of a weight, reused while its version holds) would
        # serve the previous weights to an eager forward -- an evaluation between steps. Count the update.
        torch.autograd.graph.increment_version(self._params)

    def _run(self, entry: _Entry, key: tuple) -> torch.Tensor:
        if entry.graph is not None:
            self._replay(entry)
            return entry.loss.double()
        if not self.capture or entry.failed or entry.runs < self.warmup:
            entry.runs += 1
            entry.loss.copy_(self._side_stream(lambda: self._body(entry.inputs)))
            return entry.loss.double()
        self._capture(entry, key)
        if entry.graph is None:  # the capture failed: this key stays eager
            entry.loss.copy_(self._body(entry.inputs))
            return entry.loss.double()
        self._replay(entry)  # capturing ran nothing: the replay is this batch's step
        return entry.loss.double()

    def _side_stream(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """fn() on a side stream on CUDA (warm-up before capture: what it initialises lazily must not be
        on the stream a graph is captured from), inline on the CPU."""
        if self.device.type != "cuda":
            return fn()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            out = fn()
        current.wait_stream(side)
        return out

    def _capture(self, entry: _Entry, key: tuple) -> None:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                entry.loss.copy_(self._body(entry.inputs))
        except Exception as e:  # noqa: BLE001 -- whatever breaks capture, the step itself still runs
            entry.failed = True
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.capture_errors.append(why)
            log.warning("cuda graphs: capturing the step of key %s failed (%s); it runs eagerly", key, why)
            torch.cuda.synchronize(self.device)
            return
        if self.pool is None:
            self.pool = graph.pool()  # every later bucket's graph allocates from the first's pool
        entry.graph = graph
        self._once("captured", "cuda graphs: the train step is captured per bucket (%s)",
                   self.plan.lengths if self.plan is not None else "exact shapes")

    def summary(self) -> dict[str, Any]:
        """How the steps ran so far: graphs captured, replays, eager steps outside any entry, failed captures."""
        return {"graphs": sum(e.graph is not None for e in self.entries.values()), "replays": self.replays,
                "eager_steps": self.eager_steps, "capture_errors": list(self.capture_errors)}


def plan_for(task: Any, batches: Sequence[Sequence[int]], count: int = 3) -> BucketPlan | None:
    """The bucket plan of a task that pads (``graph_lengths``/``pad_batch``), from its batches; None otherwise."""
    if not (hasattr(task, "graph_lengths") and hasattr(task, "pad_batch")) or not batches:
        return None
    return BucketPlan.of([tuple(task.graph_lengths(list(b))) for b in batches], count)


def for_run(task: Any, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, *,
            wanted: bool | None, device: torch.device, distributed: bool, amp: str | None,
            clip_norm: float | None, batches: Sequence[Sequence[int]]) -> GraphedTrainStep | None:
    """The graphed step the training loop runs, or None for its plain step; the optimizer prepared for it.

    wanted: the run's ``cuda_graphs`` setting (None: on when the device is CUDA). True on the CPU runs the
    static-buffer step without capture (what the tests compare with the plain step). What graphs cannot
    hold turns them off with one log line: DDP (its gradient hooks all-reduce as the backward runs), fp16
    (its loss scaler skips steps on the host), an optimizer without a capturable mode."""
    graphed = device.type == "cuda" if wanted is None else bool(wanted)
    reason = None
    if graphed and distributed:
        reason = "a distributed run steps eagerly"
    elif graphed and amp == "fp16":
        reason = "fp16's loss scaling decides on the host"
    elif graphed and not supports_graphs(optimizer):
        reason = f"{type(optimizer).__name__} has no capturable mode"
    if reason is not None:
        log.info("cuda graphs: off (%s)", reason)
        graphed = False
    prepare_optimizer(optimizer, device, graphed)
    if not graphed:
        return None
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp or "")
    plan = plan_for(task, batches)
    log.info("cuda graphs: on (%s; buckets %s)", "captured" if device.type == "cuda" else "static buffers, eager",
             plan.lengths if plan is not None else "by exact shape")
    return GraphedTrainStep(task, model, optimizer, scheduler, device=device, plan=plan, clip_norm=clip_norm,
                            amp_dtype=amp_dtype)
