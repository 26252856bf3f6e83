"""The model-agnostic training loop: one process or torchrun + DistributedDataParallel.

A model family plugs in as a ``Task`` (data order, collate, loss, optimizer, evaluation, what a checkpoint
must carry); ``fit`` does the rest -- device, DDP, mixed precision, clipping, EMA, evaluation, atomic
checkpoints, exact resume, progress, ``metrics.jsonl`` and the learning-curve PNG. Each piece is a
small function so the loop reads top to bottom.

Progress (``display``): on a terminal, a bar over the optimizer steps -- total ``max_steps``, or the steps of
``epochs``, or under a time budget the steps it leaves at the measured step rate -- whose postfix shows the
smoothed loss, the last evaluation's headline metric (``Task.headline_metrics``), the measured steps/s and
the time spent of the budget; ``progress=False`` or no terminal: a log line per logged step. After the
first 20 steps (the first 5 are warm-up, left out of the rate), one line says what to expect: the preset,
the threads, the measured step rate and the documented run of the recipe (``expectations``).

The time budget (``max_minutes``) holds the whole run, the final evaluation and checkpoint included
(``budget``): training stops at the first step boundary where elapsed + one step + reserve >= budget, the
reserve being the longest evaluation-and-checkpoint measured so far or, before one, an estimate from the
evaluation's size (``Task.eval_size``) and the measured step rate; an evaluation due at that boundary
counts twice (its own and the final one), so when both do not fit, it is the final one. The budget is the
whole run's: the checkpoint keeps the time spent up to it (``elapsed_s``), and a resumed run goes on from
there (it is refused, in one line, when that already spends the budget: ``--max-minutes`` is then raised).

A first evaluation comes early: a run that evaluates every ``eval_every`` steps also evaluates at the first
step boundary after ``first_eval_minutes`` of training (at most a tenth of the time budget) when no evaluation
has come yet, so a run shows its metrics within minutes rather than after ``eval_every`` steps; it also times
an evaluation, which the time budget then reserves instead of an estimate.

Exact resume: the data order is a pure function of (seed, epoch) (``Task.train_batches``), so the
checkpoint stores only the epoch and how many of its batches were done, plus every RNG state (of every
rank). Evaluation runs under ``torch.random.fork_rng`` so it never moves the training RNG: a run that
stopped, evaluated and resumed draws the same dropout masks as one that never stopped.

Reproducible: the CPU GEMM engine decisions (which change rounding) are restored from the machine's cache
before the first step and saved in every checkpoint (``gemm_cache``), so two runs of the same command on
the same machine, and a run resumed from its checkpoint, give bit-identical losses.

Nothing lost: SIGINT/SIGTERM make the loop write a checkpoint at the next step boundary and raise
``TrainingInterrupted`` (a second signal quits at once, see ``interrupt``); a checkpoint is also written
every ``save_every_minutes``. The run folder is locked while ``fit`` writes it and the leftovers of an
interrupted atomic write are removed at the start (``run_folder``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

import numpy as np
import torch
from torch import nn

from .._backend import kernel_choices, restore_kernel_choices
from ..data.batching import shard
from ..data.metrics import MetricsLog
from ..errors import UserError
from ..plots import plot_learning_curve
from . import cuda_graphs, display, distributed
from .budget import TimeBudget
from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .display import StepClock, TrainBar
from .distributed import DistEnv
from .ema import EMA
from ..data.gemm_cache import MachineGemmPlan
from .expectations import EXPECTATION_STEP, expectation_line
from .interrupt import StopSignals, TrainingInterrupted
from .run_folder import RunFolderLock, remove_stale_temporaries

__all__ = ["TrainSettings", "Task", "fit", "seed_everything"]

log = logging.getLogger("fastqa.train")


@dataclass
class TrainSettings:
    """How to train (not what): the same for every model family."""

    out_dir: str
    max_steps: int | None = None       # optimizer steps in all (resume counts the steps already done)
    epochs: int | None = None          # passes over the training data; with no limit at all: 1 epoch
    clip_norm: float | None = None     # max global gradient norm
    ema_decay: float | None = None     # keep an EMA of the weights; evaluation and prediction use it
    eval_every: int = 1000             # steps between evaluations (0: only at epoch ends and at the end)
    eval_each_epoch: bool = True
    log_every: int = 50                # steps between train-loss rows in metrics.jsonl
    seed: int = 0
    amp: str | None = None             # "bf16" / "fp16": torch.autocast (fp16: CUDA only)
    resume: bool = False
    progress: bool = True
    max_minutes: float | None = None   # wall-clock budget, the final evaluation and checkpoint included
    device: str | None = None
    save_every_minutes: float | None = 10.0  # also checkpoint (without evaluating) this often; None or 0: off
    cuda_graphs: bool | None = None    # the step as CUDA graphs (``cuda_graphs``); None: on CUDA; ``fit`` records what ran
    first_eval_minutes: float | None = 5.0  # the first evaluation this soon when eval_every is far (None or 0: off)

    def __post_init__(self) -> None:
        for name in ("max_steps", "epochs"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise UserError(f"{name} must be >= 1, got {v}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise UserError(f"max_minutes must be > 0, got {self.max_minutes}")
        if self.first_eval_minutes is not None and not self.first_eval_minutes >= 0:
            raise UserError(f"first_eval_minutes must be >= 0 (0: off), got {self.first_eval_minutes}")
        if self.save_every_minutes is not None and self.save_every_minutes < 0:
            raise UserError(f"save_every_minutes must be >= 0 (0: off), got {self.save_every_minutes}")
        if self.amp not in (None, "bf16", "fp16"):
            raise UserError(f"amp must be None, 'bf16' or 'fp16', got {self.amp!r}")


class Task(Protocol):
    """What ``fit`` needs from a model family (QANet on SQuAD, ConvS2S on parallel text, ...)."""

    kind: str
    model: nn.Module

    def train_batches(self, epoch: int) -> list[list[int]]:
        """Global batches of example indices for ``epoch``, deterministic in (seed, epoch)."""

    def collate(self, indices: list[int], device: torch.device) -> Any:
        """The batch for ``loss``, on ``device``."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Scalar mean loss over the batch's examples (``model`` may be DDP-wrapped: call it)."""

    def configure_optimizer(self, model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
        """(optimizer, LR scheduler stepped once per optimizer step, or None)."""

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Metrics on held-out data; called on rank 0 in eval mode under no_grad (EMA weights in)."""

    def checkpoint_meta(self) -> dict:
        """What loading the model needs besides weights: config, vocabularies, ..."""

    # Optional attributes, read with getattr (a task without them trains the same):
    #   command: str                      the command that trains it, for the expectation line ("qa-train")
    #   preset: str | None                its model preset, for the expectation line (``expectations``)
    #   reference_run                     the documented run of its recipe, which that line quotes
    #   headline_metrics: tuple[str, ...] the evaluation's metrics the bar shows (("EM", "F1"), ("val_bleu",))
    #   eval_size: float                  the examples an evaluation reads, for the time budget's estimate of
    #                                     an evaluation before one is timed (``budget``)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (call before building the model so its initial weights are fixed)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class _Progress:
    """Where the run is: ``batch_in_epoch`` global batches of ``epoch`` are done, ``step`` steps in all."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


def _differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """Keys under which two checkpoint metas differ (vocabularies compared whole)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for k in sorted(set(saved) | set(current), key=str):
            out += _differences(saved.get(k), current.get(k), f"{prefix}{k}.")
        return out
    return [] if saved == current else [prefix.rstrip(".")]


def _restore(task: Task, payload: dict, path: Path, optimizer, scheduler, ema: EMA | None,
             env: DistEnv, scaler: torch.amp.GradScaler) -> _Progress:
    """Load every piece of a run's state from its checkpoint, checking it belongs to this task."""
    if payload.get("kind") != task.kind:
        raise UserError(f"{path}: a {payload.get('kind')!r} checkpoint cannot resume a {task.kind!r} run")
    differ = _differences(payload.get("meta"), task.checkpoint_meta())
    if differ:
        raise UserError(f"{path}: the checkpoint was trained with another config or vocabulary "
                        f"(differs in: {', '.join(differ[:5])}); use another --out folder")
    task.model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None and payload.get("scheduler") is not None:
        scheduler.load_state_dict(payload["scheduler"])
    if scaler.is_enabled() and payload.get("grad_scaler") is not None:
        scaler.load_state_dict(payload["grad_scaler"])
    if ema is not None:
        if payload.get("ema") is None:
            raise UserError(f"{path}: the run kept no EMA; resume it without --ema")
        ema.load_state_dict(payload["ema"], payload["ema_updates"])
    rng = payload["rng"]
    if len(rng) != env.world_size:
        log.warning("resuming a %d-process run with %d processes: the data order is the same, dropout masks "
                    "will differ", len(rng), env.world_size)
    _set_rng_state(rng[env.rank % len(rng)])
    # The same GEMM engine for every shape and the same Triton configuration for every kernel and key as
    # before the interruption (both are measured per process, and two choices round differently):
    # bit-identical losses after resuming. Older checkpoints hold the CPU GEMM plan alone: restored too.
    restore_kernel_choices(payload.get("gemm_plan"))
    return _Progress(step=payload["step"], epoch=payload["epoch"], batch_in_epoch=payload["batch_in_epoch"])


def _save(task: Task, settings: TrainSettings, optimizer, scheduler, ema: EMA | None, progress: _Progress,
          env: DistEnv, scaler: torch.amp.GradScaler, elapsed_s: float = 0.0) -> None:
    """Atomic checkpoint by rank 0, with every rank's RNG state (gathered: all ranks must call this) and the
    run's time so far (``elapsed_s``: what a resumed run's time budget has already spent)."""
    rng = distributed.all_gather_object(_rng_state(), env)
    if env.is_main:
        save_checkpoint(settings.out_dir, {
            "kind": task.kind,
            "meta": task.checkpoint_meta(),
            "model": task.model.state_dict(),
            "ema": ema.state_dict() if ema is not None else None,
            "ema_updates": ema.updates if ema is not None else 0,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "grad_scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "rng": rng,
            "gemm_plan": kernel_choices(),
            "settings": asdict(settings),
            "elapsed_s": float(elapsed_s),
            **asdict(progress),
        })


def _evaluate(task: Task, ema: EMA | None, env: DistEnv) -> dict[str, float]:
    """Rank 0 evaluates (EMA weights swapped in, RNG untouched); the other ranks wait for it."""
    metrics: dict[str, float] = {}
    if env.is_main:
        model = task.model
        was_training = model.training
        model.eval()
        with torch.random.fork_rng(devices=[env.device] if env.device.type == "cuda" else []), torch.no_grad():
            if ema is not None:
                with ema.swapped_in(model):
                    metrics = dict(task.evaluate(model))
            else:
                metrics = dict(task.evaluate(model))
        model.train(was_training)
    distributed.barrier(env)
    return metrics


def _batches(task: Task, progress: _Progress, env: DistEnv) -> Iterator[tuple[list[int], list[int]]]:
    """(global batch, this rank's shard) from where the run stands, epoch after epoch (forever)."""
    while True:
        batches = task.train_batches(progress.epoch)
        if not batches:
            raise UserError("the training data gives no batch (is the training set empty after filtering?)")
        for b in batches[progress.batch_in_epoch:]:
            if len(b) < env.world_size:  # a rank with no example would stall DDP's all-reduce
                progress.batch_in_epoch += 1
                continue
            yield b, shard(b, env.rank, env.world_size)
        progress.epoch += 1
        progress.batch_in_epoch = 0
        yield [], []  # end-of-epoch marker: a checkpoint taken now resumes at the next epoch's start


def _train_step(task: Task, model: nn.Module, optimizer, scheduler, batch_global: list[int], batch_local: list[int],
                settings: TrainSettings, env: DistEnv, scaler: torch.amp.GradScaler) -> torch.Tensor:
    """One optimizer step; returns the global-batch loss (every rank's shard weighted by its size) as a
    float64 scalar tensor on the device: reading it would make the host wait for the device, so the loop
    reads the losses only when it logs, checkpoints or evaluates (``_LossWindow``)."""
    batch = task.collate(batch_local, env.device)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.amp or "")
    with torch.autocast(env.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = task.loss(model, batch)
    # DDP averages gradients over ranks; weighting by the shard's share makes that the global-batch mean
    # even when the shards differ in size.
    weight = len(batch_local) * env.world_size / len(batch_global)
    optimizer.zero_grad(set_to_none=True)
    # fp16 gradients underflow without loss scaling; the scaler is a no-op for fp32 and bf16 (enabled only
    # for fp16 on CUDA), and skips the step whose scaled gradients overflowed.
    scaler.scale(loss * weight).backward()
    if settings.clip_norm is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(task.model.parameters(), settings.clip_norm)
    scaler.step(optimizer)
    scaler.update()
    if scheduler is not None:
        scheduler.step()
    value = loss.detach() * weight / env.world_size
    if env.distributed:
        torch.distributed.all_reduce(value)
    return value.double()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class _LossWindow:
    """The training losses since the last log row, summed on the device (float64, as Python floats would)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | float = 0.0
        self.steps = 0
        self.first_step = 0

    def add(self, loss: torch.Tensor, step: int) -> None:
        if not self.steps:
            self.first_step = step
        self.total = self.total + loss
        self.steps += 1

    def mean(self) -> float:
        """The window's mean loss (one host read); a non-finite one stops training before anything is saved."""
        value = float(self.total) / max(self.steps, 1)
        if not math.isfinite(value):
            raise FloatingPointError(f"the training loss is {value} between steps {self.first_step} and "
                                     f"{self.first_step + self.steps - 1}; try a lower learning rate or gradient "
                                     "clipping")
        return value

    def reset(self) -> None:
        self.total, self.steps = 0.0, 0


def _epoch_limit(settings: TrainSettings) -> int | None:
    """The epochs that bound the run: ``epochs``, or with no limit at all one epoch (a time budget alone
    trains epoch after epoch until it is spent)."""
    if settings.epochs is not None:
        return settings.epochs
    return None if settings.max_steps is not None or settings.max_minutes is not None else 1


def _total_steps(steps_per_epoch: int, settings: TrainSettings) -> int | None:
    """The run's steps when a step or epoch limit bounds it (None under a time budget alone)."""
    epochs = _epoch_limit(settings)
    if epochs is None:
        return settings.max_steps
    total = steps_per_epoch * epochs
    return total if settings.max_steps is None else min(total, settings.max_steps)


def _stop_reason(settings: TrainSettings, progress: _Progress, over_budget: bool) -> str | None:
    """Why training ends here, or None; ``over_budget``: the time budget leaves no room for another step
    (agreed by all ranks; see ``budget``)."""
    if settings.max_steps is not None and progress.step >= settings.max_steps:
        return "max_steps"
    limit_epochs = _epoch_limit(settings)
    if limit_epochs is not None and progress.epoch >= limit_epochs:
        return "epochs"
    return "max_minutes" if over_budget else None


def _first_eval_s(settings: TrainSettings) -> float | None:
    """Seconds of training after which the first evaluation comes when none has yet (module docstring): the
    ``first_eval_minutes``, at most a tenth of the time budget; None: off (or no step-based evaluations)."""
    if not settings.eval_every or not settings.first_eval_minutes:
        return None
    seconds = settings.first_eval_minutes * 60
    return seconds if settings.max_minutes is None else min(seconds, settings.max_minutes * 6)


def _estimates(step: int, total: int | None, clock: StepClock, *, budget: TimeBudget | None, elapsed: float,
               evals_per_step: float, eval_s: float | None) -> tuple[int | None, float | None]:
    """(the run's steps as the time budget sees them, the seconds left) at ``step``, from the measured step
    rate; None where not known yet (no rate, or neither a step total nor a budget). The steps under a budget:
    those it leaves (``TimeBudget.steps_left``), or the step total when smaller. The seconds: the steps to go,
    plus the evaluations on the way and the final one (the budget's reserve, else the longest evaluation so
    far, ``eval_s``), and never more than the budget leaves."""
    if not clock.measured or not clock.step_s:
        return None, None
    estimate = None
    if budget is not None:
        left = budget.steps_left(elapsed, clock.step_s, evals_per_step=evals_per_step)
        estimate = None if left is None else step + left
    end = min(x for x in (estimate, total) if x is not None) if (estimate, total) != (None, None) else None
    if end is None:
        return estimate, None
    to_go = max(0, end - step)
    per_eval = budget.reserve(clock.step_s) if budget is not None else (eval_s or 0.0)
    seconds = to_go * clock.step_s + (to_go * evals_per_step + 1) * per_eval
    if budget is not None:
        seconds = min(seconds, max(0.0, budget.seconds - elapsed))
    return estimate, seconds


@dataclass
class _Boundary:
    """What every rank agrees on at a step boundary (one all-reduce)."""

    over_budget: bool
    signum: int         # the stop signal received by any rank, 0 for none
    save_due: bool      # the time-based checkpoint is due
    first_eval: bool    # the early first evaluation is due (``first_eval_minutes``)


def _at_boundary(settings: TrainSettings, started: float, saved_time: float, signals: StopSignals,
                 env: DistEnv, budget: TimeBudget | None, step_s: float | None, eval_due: bool,
                 first_eval: bool = False) -> _Boundary:
    now = time.monotonic()
    due = bool(settings.save_every_minutes) and now - saved_time >= settings.save_every_minutes * 60
    over = budget is not None and budget.must_stop(now - started, step_s, eval_due=eval_due or first_eval,
                                                   save_due=due)
    over_v, signum, due_v, first_v = distributed.max_each([over, signals.requested or 0, due, first_eval], env)
    return _Boundary(over_budget=over_v > 0, signum=int(signum), save_due=due_v > 0, first_eval=first_v > 0)


def fit(task: Task, settings: TrainSettings) -> dict[str, float]:
    """Train ``task.model`` as ``settings`` say; returns the last evaluation's metrics (plus ``step``).

    Raises ``TrainingInterrupted`` (after writing a checkpoint) when SIGINT or SIGTERM arrives, and a
    ``UserError`` when another trainer holds the run folder."""
    env = distributed.init_distributed(settings.device)
    with contextlib.ExitStack() as stack:
        if env.is_main:
            stack.enter_context(RunFolderLock(settings.out_dir))  # first: nothing below may touch a busy folder
            remove_stale_temporaries(settings.out_dir)
        signals = stack.enter_context(StopSignals())
        try:
            return _fit(task, settings, env, signals)
        except RuntimeError as e:
            if env.distributed and distributed.is_peer_failure(e):
                raise distributed.rank_lost(env, e, settings.out_dir) from None
            raise


def _fit(task: Task, settings: TrainSettings, env: DistEnv, signals: StopSignals) -> dict[str, float]:
    return _Run(task, settings, env, signals).train()


class _Run:
    """One ``fit`` call: what it set up (model, optimizer, EMA, budget, bar, ...) and where it stands. Each
    method is one part of the loop: ``train`` reads top to bottom, the parts say how."""

    def __init__(self, task: Task, settings: TrainSettings, env: DistEnv, signals: StopSignals) -> None:
        self.started = time.monotonic()  # the time budget's clock: everything ``fit`` does is in it
        self.task, self.env, self.signals = task, env, signals
        self.out = Path(settings.out_dir)
        self.ckpt_path = self.out / CHECKPOINT_NAME
        if settings.amp == "fp16" and env.device.type != "cuda":
            raise UserError("amp='fp16' needs a CUDA device (loss scaling, and no fp16 CPU kernels); on the CPU use 'bf16'")
        self.model = model = task.model.to(env.device)
        self.optimizer, self.scheduler = task.configure_optimizer(model)
        self.scaler = torch.amp.GradScaler(env.device.type,
                                           enabled=settings.amp == "fp16" and env.device.type == "cuda")
        self.ema = EMA(model, settings.ema_decay) if settings.ema_decay else None
        # The machine's GEMM engine decisions before any step (a resumed run then restores its checkpoint's on
        # top, which win). Only CPU runs multiply on those engines.
        self.gemm_plan = MachineGemmPlan.open() if env.device.type == "cpu" else None
        if self.gemm_plan is not None:
            self.gemm_plan.restore()
        # Ranks restarted by torchrun (--max-restarts) continue from the last checkpoint, if the run wrote one.
        resume = settings.resume or (distributed.restart_count() > 0 and self.ckpt_path.is_file())
        self.progress = self._resume(settings) if resume else self._start(settings)
        self.metrics_log = (MetricsLog(self.out, resume_step=self.progress.step if resume else None)
                            if env.is_main else None)
        self.ddp_model = distributed.wrap_ddp(model, env)
        model.train()
        self._plan(settings)
        self.window_start, self.window = time.monotonic(), _LossWindow()
        self.last_eval: dict[str, float] = {}
        self.saved_at, self.saved_time, self.evaluated_at = -1, time.monotonic(), -1
        self.expected = False
        self.first_eval_s = _first_eval_s(self.settings)
        self.first_eval_agreed = False
        self.eval_s: float | None = None  # the longest evaluation and checkpoint so far (the ETA's, without a budget)
        self.trained_from = self.started  # set again when training starts (the early first evaluation's clock)

    def _resume(self, settings: TrainSettings) -> _Progress:
        """Every piece of the run's state from its checkpoint; the time budget's clock set back by the time
        the run already spent (module docstring)."""
        payload = load_checkpoint(self.ckpt_path)
        progress = _restore(self.task, payload, self.ckpt_path, self.optimizer, self.scheduler, self.ema,
                            self.env, self.scaler)
        spent = float(payload.get("elapsed_s") or 0.0)
        del payload
        if settings.max_minutes is not None and spent >= settings.max_minutes * 60:
            raise UserError(f"{self.ckpt_path}: the run already spent {_clock(spent)} of its time budget "
                            f"({_clock(settings.max_minutes * 60)}; --max-minutes counts the whole run, the time "
                            "before --resume included): pass a larger --max-minutes to train on")
        self.started -= spent
        log.info("resumed %s at step %d (epoch %d, batch %d)%s", self.ckpt_path, progress.step, progress.epoch,
                 progress.batch_in_epoch, f"; {_clock(spent)} of the time budget already spent"
                 if settings.max_minutes is not None else "")
        return progress

    def _start(self, settings: TrainSettings) -> _Progress:
        """A new run: refused over another run's checkpoint; the dropout seed per rank."""
        if self.env.is_main and self.ckpt_path.exists():
            raise UserError(f"{self.ckpt_path} exists: pass --resume to continue that run, or choose another --out")
        torch.manual_seed(settings.seed + self.env.rank)  # dropout masks differ per rank, as each rank's data does
        return _Progress()

    def _plan(self, settings: TrainSettings) -> None:
        """The step (graphed or plain), the run's length, its time budget and its progress bar."""
        task, env = self.task, self.env
        first_epoch = task.train_batches(0)
        # The graphed step (None: the plain one); the settings saved with each checkpoint say which ran.
        self.graphed = cuda_graphs.for_run(task, self.model, self.optimizer, self.scheduler,
                                           wanted=settings.cuda_graphs, device=env.device,
                                           distributed=env.distributed, amp=settings.amp,
                                           clip_norm=settings.clip_norm, batches=first_epoch)
        self.settings = settings = dataclasses.replace(settings, cuda_graphs=self.graphed is not None)
        steps_per_epoch = len(first_epoch)
        self.total = _total_steps(steps_per_epoch, settings)
        self.clock = StepClock()
        self.budget = None
        if settings.max_minutes is not None:
            self.budget = TimeBudget(settings.max_minutes * 60,
                                     examples_per_step=sum(map(len, first_epoch)) / max(steps_per_epoch, 1),
                                     eval_examples=getattr(task, "eval_size", None),
                                     checkpoint_bytes=_checkpoint_bytes(self.model, self.ema))
        # Evaluations per training step, for the time budget's estimate of the steps it leaves.
        self.evals_per_step = ((1 / settings.eval_every if settings.eval_every else 0.0)
                               + (1 / steps_per_epoch if settings.eval_each_epoch and steps_per_epoch else 0.0))
        self.bar = None
        if settings.progress and env.is_main and display.is_terminal(display.bar_stream()):
            self.bar = TrainBar(f"{task.kind} train", total=self.total, initial=self.progress.step,
                                metric_names=getattr(task, "headline_metrics", ()),
                                budget_s=self.budget.seconds if self.budget is not None else None,
                                file=display.bar_stream())

    def train(self) -> dict[str, float]:
        """Step until a limit, the time budget or a signal ends the run; then the final evaluation and
        checkpoint. Returns the last evaluation's metrics (plus ``step``)."""
        batches = _batches(self.task, self.progress, self.env)
        reason = self.boundary()
        self.trained_from = time.monotonic()  # the early first evaluation counts training time from here
        while reason is None:
            t0 = time.monotonic()
            batch_global, batch_local = next(batches)
            if not batch_global:  # an epoch ended
                reason = self._epoch_end()
                continue
            self._step(batch_global, batch_local, t0)
            if self.progress.step % self.settings.log_every == 0:
                self._log_window()
            reason = self._after_step()
        if not self.expected and self.clock.steps and self.env.is_main:
            self.expect()  # a run shorter than EXPECTATION_STEP steps: with what it measured
        # The final evaluation and checkpoint, unless the last step already wrote them.
        if self.evaluated_at != self.progress.step:
            self.evaluate_and_save(reason)
        if self.gemm_plan is not None:
            self.gemm_plan.record()  # the final evaluation's shapes
        if self.bar is not None:
            self.bar.close(finished=True)
        return {"step": self.progress.step, **self.last_eval}

    def _epoch_end(self) -> str | None:
        """The epoch's evaluation (when asked for) at its end; returns why training ends here, or None."""
        if self.settings.eval_each_epoch:
            reason = self.boundary(eval_due=True)
            if reason is not None:
                return reason  # the final evaluation is this epoch's
            self.evaluate_and_save(f"end of epoch {self.progress.epoch - 1}")
        return self.boundary()

    def _step(self, batch_global: list[int], batch_local: list[int], t0: float) -> None:
        """One optimizer step (graphed or plain), the EMA, the loss window, the step clock and the bar."""
        if self.graphed is not None:
            loss = self.graphed.step(batch_local)
        else:
            loss = _train_step(self.task, self.ddp_model, self.optimizer, self.scheduler, batch_global, batch_local,
                               self.settings, self.env, self.scaler)
        progress, clock = self.progress, self.clock
        progress.step += 1
        progress.batch_in_epoch += 1
        if self.ema is not None:
            self.ema.update(self.model)
        self.window.add(loss, progress.step)
        clock.add(time.monotonic() - t0)
        if self.bar is not None:
            elapsed = time.monotonic() - self.started
            estimate, left_s = _estimates(progress.step, self.total, clock, budget=self.budget, elapsed=elapsed,
                                          evals_per_step=self.evals_per_step, eval_s=self.eval_s)
            self.bar.step(loss, steps_per_s=clock.steps_per_s,
                          elapsed_s=elapsed if self.budget is not None else None, estimate=estimate, left_s=left_s)
        if not self.expected and clock.steps == EXPECTATION_STEP and self.env.is_main:
            self.expect()

    def _log_window(self) -> None:
        """The loss window's mean: a log line (without a bar) and a ``train`` row in metrics.jsonl."""
        progress, window = self.progress, self.window
        mean = window.mean()
        if self.bar is None and self.env.is_main:  # --no-progress or no terminal: a log line per logged step
            log.info("step %d%s, epoch %d: loss %.4f, %.2f steps/s, %s elapsed", progress.step,
                     f"/{self.total}" if self.total else "", progress.epoch, mean,
                     window.steps / max(time.monotonic() - self.window_start, 1e-9),
                     _clock(time.monotonic() - self.started))
        if self.env.is_main:
            elapsed = time.monotonic() - self.window_start
            self.metrics_log.write({"kind": "train", "step": progress.step, "epoch": progress.epoch,
                                    "loss": mean, "lr": float(self.optimizer.param_groups[0]["lr"]),
                                    "steps_per_s": window.steps / max(elapsed, 1e-9),
                                    "time": round(time.monotonic() - self.started, 2)})
        self.window_start = time.monotonic()
        window.reset()

    def _after_step(self) -> str | None:
        """The step boundary, then the evaluation due (every ``eval_every`` steps, or the early first one);
        returns why training ends here, or None."""
        step = self.progress.step
        eval_due = bool(self.settings.eval_every) and step % self.settings.eval_every == 0
        first_eval = (not eval_due and self.first_eval_s is not None and self.evaluated_at < 0
                      and time.monotonic() - self.trained_from >= self.first_eval_s)
        reason = self.boundary(eval_due, first_eval)
        if reason is None and (eval_due or self.first_eval_agreed):
            self.evaluate_and_save("eval_every" if eval_due else "first evaluation")
        return reason

    def say(self, message: str) -> None:
        if self.env.is_main:
            (self.bar.write if self.bar is not None else log.info)(message)

    def steps_left(self) -> int | None:
        """The steps the time budget still leaves at the measured rate (None: no budget, or no rate yet)."""
        if self.budget is None or not self.clock.measured:
            return None
        return self.budget.steps_left(time.monotonic() - self.started, self.clock.step_s,
                                      evals_per_step=self.evals_per_step)

    def expect(self) -> None:
        """The one line of what to expect (``expectations``), once the step rate is measured."""
        self.expected = True
        task, clock, left = self.task, self.clock, self.steps_left()
        self.say(expectation_line(getattr(task, "command", f"{task.kind} training"), task.kind,
                                  preset=getattr(task, "preset", None), where=_where(self.env),
                                  reference=getattr(task, "reference_run", None),
                                  steps_per_minute=60 / clock.step_s if clock.measured else None,
                                  steps_timed=clock.steps, budget_minutes=self.settings.max_minutes,
                                  budget_steps=None if left is None else clock.steps + left))

    def save(self) -> None:
        if self.window.steps:
            self.window.mean()  # never checkpoint weights that a non-finite loss has already spoilt
        t0 = time.monotonic()
        _save(self.task, self.settings, self.optimizer, self.scheduler, self.ema, self.progress, self.env,
              self.scaler, t0 - self.started)
        self.saved_at, self.saved_time = self.progress.step, time.monotonic()
        if self.budget is not None:
            self.budget.record_checkpoint(self.saved_time - t0)

    def evaluate_and_save(self, reason: str) -> None:
        progress = self.progress
        t0 = time.monotonic()
        self.last_eval = _evaluate(self.task, self.ema, self.env)
        self.evaluated_at = progress.step
        if self.env.is_main:
            row = {"kind": "eval", "step": progress.step, "epoch": progress.epoch,
                   "time": round(time.monotonic() - self.started, 2), **self.last_eval}
            self.metrics_log.write(row)
            try:
                plot_learning_curve(self.metrics_log.path, self.out / "curve.png",
                                    title=f"{self.task.kind}: {self.out.name}")
            except (OSError, UserError) as e:  # a full disk: the checkpoint below matters more, and says why
                log.warning("the learning curve is not updated: %s", e)
            text = " | ".join(f"{k} {v:.4g}" for k, v in self.last_eval.items())
            self.say(f"step {progress.step} ({reason}) | {text}")
            if self.bar is not None:
                self.bar.evaluated(progress.step, self.last_eval)
        # The row first, then the checkpoint: a run killed in between resumes from the previous checkpoint
        # and drops the row; the other order would resume past an evaluation that metrics.jsonl never got.
        self.save()
        self.eval_s = max(self.eval_s or 0.0, time.monotonic() - t0)
        if self.budget is not None:  # what the end of the run will take (see ``budget``)
            self.budget.record_evaluation(time.monotonic() - t0)

    def boundary(self, eval_due: bool = False, first_eval: bool = False) -> str | None:
        """Between two steps: keep the machine's GEMM decisions up to date, act on a stop signal (checkpoint,
        then raise) or a due time-based checkpoint; returns why training ends here, or None. ``eval_due``: an
        evaluation is due here (the time budget must hold it and the final one); ``first_eval``: this rank's
        time for the early first evaluation has come (the ranks agree on it: ``first_eval_agreed``)."""
        progress, budget = self.progress, self.budget
        if self.gemm_plan is not None:
            self.gemm_plan.record()
        agreed = _at_boundary(self.settings, self.started, self.saved_time, self.signals, self.env, budget,
                              self.clock.step_s, eval_due, first_eval)
        self.first_eval_agreed = agreed.first_eval
        if agreed.signum:
            log.info("%s: saving a checkpoint at step %d, then stopping", signal.Signals(agreed.signum).name,
                     progress.step)
            if self.saved_at != progress.step:
                self.save()
            if self.bar is not None:
                self.bar.close()
            raise TrainingInterrupted(agreed.signum, progress.step, str(self.out))
        reason = _stop_reason(self.settings, progress, agreed.over_budget)
        if reason == "max_minutes":
            reserve = budget.reserve(self.clock.step_s)
            self.say(f"time budget: training stops at {_clock(time.monotonic() - self.started)} (step "
                     f"{progress.step}), leaving {reserve:.1f} s for the final evaluation and checkpoint ("
                     + ("as long as the longest so far)" if budget.measured else "estimated: none timed yet)"))
        if reason is None and agreed.save_due and self.saved_at != progress.step:
            self.save()
        return reason


def _checkpoint_bytes(model: nn.Module, ema: EMA | None) -> int:
    """A checkpoint's size before one is written: the weights, their EMA and an optimizer's two moments per
    trainable weight (Adam's; the time budget's estimate before a checkpoint is timed)."""
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights * (2 if ema is not None else 1) + 2 * trainable


def _where(env: DistEnv) -> str:
    """What trains, for the expectation line: "2 threads", "cuda (NVIDIA H100 80GB HBM3)", "2 processes x 1 thread"."""
    if env.device.type == "cuda":
        here = f"cuda ({torch.cuda.get_device_name(env.device)})"
    else:
        n = torch.get_num_threads()
        here = f"{n} thread{'s' if n != 1 else ''}"
    return f"{env.world_size} processes x {here}" if env.world_size > 1 else here
