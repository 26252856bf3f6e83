"""A phase child (``--child KEY``): one in-process phase (b, c, d or f) run to a result file, stopping itself at
its deadline. The ``Recorder`` records each measured item as it finishes, so that a child killed from outside
still leaves what it measured; the phase bodies (``op_phases``, ``model_phases``) are imported only here, inside
the guard, so that an import that fails is reported as the phase's set-up error."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import signal
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .common import short_error, tail

from fastqa.data.files import atomic_write_json  # importable once .common has put the checkout on sys.path

if TYPE_CHECKING:
    import torch

# Phase key -> "module:function" of its body, imported in the child only (the bodies import torch and fastqa).
CHILD_PHASES: dict[str, str] = {"b": "op_phases:phase_ops", "f": "op_phases:phase_overhead",
                                "c": "model_phases:phase_qanet", "d": "model_phases:phase_convs2s"}


class TimeBoxSpent(BaseException):
    """Raised by the alarm at a child's deadline. A BaseException, so that no ``except Exception`` inside
    torch or fastqa swallows it."""


def _device_lost(exc: BaseException) -> bool:
    """True for errors after which the CUDA context is unusable (every later CUDA call fails alike)."""
    text = str(exc)
    return any(s in text for s in ("illegal memory access", "CUDA error: unspecified launch failure",
                                   "device-side assert", "CUDA error: an illegal instruction"))


class Recorder:
    """A child's results: one record per item (name, status ok / failed / skipped, reason, seconds,
    figures), written to ``path`` after every item so that a killed child still leaves what it measured."""

    def __init__(self, path: Path, deadline: float) -> None:
        self.path, self.deadline = path, deadline
        self.items: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.lost: str | None = None   # set once the device is unusable (a CUDA error): later items skip
        self.flush()

    def remaining(self) -> float:
        """Seconds left until the deadline."""
        return self.deadline - time.time()

    def flush(self, done: bool = False) -> None:
        """Write what is recorded so far; ``done`` once the phase has finished (the parent checks it)."""
        atomic_write_json(self.path, {"items": self.items, "info": self.info, "done": done}, indent=1, default=str)

    def item(self, name: str, fn: Callable[[], dict[str, Any]], *, min_s: float = 0.0, **labels: Any) -> dict[str, Any]:
        """Run ``fn`` (-> its figures; a ``failed`` key in them fails the item with that reason) and record it;
        skipped when the time box cannot fit ``min_s`` more or the device is lost."""
        record: dict[str, Any] = {"name": name, **labels}
        left = self.remaining()
        if self.lost:
            record.update(status="skipped", reason=f"not run: {self.lost}")
        elif left < max(min_s, 0.5):
            record.update(status="skipped", reason=f"phase time box spent ({left:.0f} s left, item needs ~{min_s:.0f} s)")
        else:
            print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
            t0 = time.perf_counter()
            try:
                figures = fn()
                reason = figures.pop("failed", None)
                record.update(figures)
                record["status"] = "failed" if reason else "ok"
                if reason:
                    record["reason"] = reason
            except TimeBoxSpent:
                record.update(status="skipped", reason="phase time box ran out during this item")
            except Exception as exc:
                text = traceback.format_exc()
                record.update(status="failed", reason=short_error(exc), error_tail=tail(text, 25))
                print(text, flush=True)
                if _device_lost(exc):
                    self.lost = f"the device failed earlier ({short_error(exc)})"
            record["seconds"] = round(time.perf_counter() - t0, 2)
            print(f"    -> {record['status']}" + (f": {record.get('reason')}" if record.get("reason") else ""), flush=True)
        self.items.append(record)
        self.flush()
        return record


@dataclasses.dataclass
class Ctx:
    """What a phase child knows: its device, whether it is tiny, the torch.compile backend."""
    device: torch.device
    tiny: bool
    compile_backend: str


def child_main(args: argparse.Namespace) -> int:
    """Run one in-process phase into ``--result``, stopping itself at ``--deadline``."""
    rec = Recorder(Path(args.result), args.deadline)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeBoxSpent()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.05, args.deadline - time.time()))
    try:
        import torch
        module, function = CHILD_PHASES[args.child].split(":")
        body = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        ctx = Ctx(device=torch.device(args.device), tiny=args.tiny, compile_backend=args.compile_backend)
        if ctx.device.type == "cuda" and ctx.device.index is not None:
            torch.cuda.set_device(ctx.device)
        body(ctx, rec)
    except TimeBoxSpent:
        rec.info["stopped"] = "the time box ran out between items"
    except Exception as exc:  # set-up failed (imports, model building): the parent reports it with the log
        rec.info["error"] = short_error(exc)
        rec.info["error_tail"] = tail(traceback.format_exc(), 25)
        traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    rec.flush(done=True)
    return 0
