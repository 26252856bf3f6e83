"""The supervisor (the parent process): the command line, the phases in order, each under its time box in a
process of its own, and the summary rewritten after every phase. It runs nothing on the device itself: a CUDA
error poisons the process that meets it and a hung kernel or compile can only be stopped from outside, so both
stay in the phase's child, and the next phase still runs."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

from . import __doc__ as USAGE
from .child import CHILD_PHASES, child_main
from .command_phases import run_bench_phase, run_pytest_phase
from .common import TOLERANCES, read_tail, short_error, tail
from .environment import collect_environment, environment_lines
from .processes import child_env, run_process
from .report import render_summary, targets

from fastqa.data.files import atomic_write_json  # importable once .common has put the checkout on sys.path

PACKAGE_DIR = Path(__file__).resolve().parent   # what a child runs: ``python scripts/gpu_check --child KEY``
# A first device run's command: a lent GPU gives 15 minutes in all, its start included, and one command
# at most 10; this leaves time to run the check again after a fix.
GLOBAL_BUDGET_S = 400.0
# A child gets this long after its time box to write its results and let CUDA shut down, before it is killed.
KILL_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase: its key (``--phases``), what it does, and its time figures (seconds): ``budget_s`` /
    ``tiny_budget_s`` its time box before any slack, ``min_s`` / ``tiny_min_s`` the least worth starting."""
    key: str
    title: str
    budget_s: float
    tiny_budget_s: float
    min_s: float
    tiny_min_s: float


# In the order of what they are worth: a first device run that is cut short still proves the kernels.
PHASES: tuple[Phase, ...] = (
    Phase("b", "every op vs its float64 reference, fp32 + bf16, model shapes", 110.0, 60.0, 20.0, 2.0),
    Phase("f", "launching vs kernels: per op, fastqa vs eager, CUDA-graph replay, bf16", 30.0, 30.0, 10.0, 2.0),
    Phase("c", "QANet paper B32: fast vs reference vs compiled, bf16 + fp32", 100.0, 90.0, 30.0, 2.0),
    Phase("d", "ConvS2S tutorial: train step, greedy + beam-5 translation", 50.0, 60.0, 20.0, 2.0),
    Phase("e", "python -m benchmarks --quick", 50.0, 60.0, 30.0, 2.0),
    Phase("a", "GPU tests: pytest -m gpu tests/ops", 50.0, 60.0, 20.0, 2.0),
)
PHASE_KEYS = tuple(p.key for p in PHASES)


def time_box(budget_s: float, explicit: bool, remaining_s: float, later_budgets_s: float) -> float:
    """Seconds a phase may run: its budget, raised (unless the budget was given explicitly) to what the global
    budget has left once the later phases' budgets are set aside; never more than the global budget left."""
    if remaining_s <= 0:
        return 0.0
    box = budget_s if explicit else max(budget_s, remaining_s - later_budgets_s)
    return min(box, remaining_s)


def run_child_phase(phase: Phase, args: argparse.Namespace, box: float, logs: Path) -> dict[str, Any]:
    """Phases b, c, d, f: this package again in ``--child`` mode, stopping itself at the box's end; killed
    ``KILL_GRACE_S`` later if it has not."""
    result_path = logs / f"{phase.key}.json"
    result_path.unlink(missing_ok=True)
    deadline = time.time() + box
    cmd = [sys.executable, str(PACKAGE_DIR), "--child", phase.key, "--result", str(result_path),
           "--deadline", repr(deadline), "--device", args.device, "--compile-backend", args.compile_backend]
    if args.tiny:
        cmd.append("--tiny")
    log = logs / f"{phase.key}.log"
    rc, seconds = run_process(cmd, log, box + KILL_GRACE_S, child_env(args.autotune))
    data: dict[str, Any] = {}
    if result_path.exists():
        try:
            data = json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            data = {"info": {"error": f"unreadable result file: {exc}"}}
    items = data.get("items", [])
    info = data.get("info", {})
    result: dict[str, Any] = {"seconds": round(seconds, 1), "log": str(log), "exit_code": rc, "items": items,
                              "info": info}
    failed = [i for i in items if i.get("status") == "failed"]
    skipped = [i for i in items if i.get("status") == "skipped"]
    ok = [i for i in items if i.get("status") == "ok"]
    counts = f"{len(ok)} ok, {len(failed)} failed, {len(skipped)} skipped of {len(items)} items"
    if rc is None:
        result.update(status="failed", reason=f"killed after {box + KILL_GRACE_S:.0f} s ({counts} recorded)",
                      error_tail=read_tail(log))
    elif rc != 0 or not data.get("done"):
        result.update(status="failed", reason=f"exit code {rc} ({counts} recorded)", error_tail=read_tail(log))
    elif info.get("error"):
        result.update(status="failed", reason=f"set-up failed: {info['error']}",
                      error_tail=info.get("error_tail") or read_tail(log))
    elif failed:
        result.update(status="failed", reason=counts)
    elif not ok:
        result.update(status="skipped", reason=f"the time box ran out before any item finished ({counts})")
    else:
        result.update(status="ok", reason=counts if skipped else None)
    if phase.key == "b" and info.get("ops_without_a_check"):
        result["note"] = "ops without a check: " + ", ".join(info["ops_without_a_check"])
    return result


def run_phase(phase: Phase, args: argparse.Namespace, box: float, logs: Path, out: Path) -> dict[str, Any]:
    """One phase under its time box -> its result (``status``, ``reason``, figures): phases a and e as commands of
    their own, the others as a child of this package."""
    try:
        if phase.key == "a":
            return run_pytest_phase(args, box, logs)
        if phase.key == "e":
            return run_bench_phase(args, box, logs, out)
        return run_child_phase(phase, args, box, logs)
    except Exception as exc:  # the check itself broke: recorded, and the next phase still runs
        return {"status": "failed", "reason": f"gpu_check error: {short_error(exc)}",
                "error_tail": tail(traceback.format_exc(), 25)}


def parse_phase_budgets(values: Sequence[str]) -> dict[str, float]:
    """{phase key: seconds} of the ``--phase-budget PHASE=SECONDS`` options."""
    out: dict[str, float] = {}
    for v in values:
        key, sep, seconds = v.partition("=")
        if not sep or key not in PHASE_KEYS:
            raise argparse.ArgumentTypeError(f"--phase-budget takes PHASE=SECONDS with PHASE in {','.join(PHASE_KEYS)}, got {v!r}")
        out[key] = float(seconds)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked; the device and torch.compile backend defaults filled in."""
    p = argparse.ArgumentParser(prog="scripts/gpu_check", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu-check-results"), help="where the summary, logs and bench go")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and step counts: every phase in seconds, on a CPU too")
    p.add_argument("--phases", default=",".join(PHASE_KEYS), help="comma list of the phases to run (default: all)")
    p.add_argument("--budget-s", type=float, default=GLOBAL_BUDGET_S, help="global time budget of the phases, seconds")
    p.add_argument("--phase-budget", action="append", default=[], metavar="PHASE=SECONDS",
                   help="this phase's time box, exactly (no slack from the global budget); repeatable")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--autotune", action="store_true",
                   help="let the Triton autotuner tune every kernel (default: each kernel's first configuration)")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of phase c (default: inductor; eager with --tiny, as inductor's C++ "
                        "compiles take minutes on a small CPU)")
    # Child mode: one in-process phase, run by the parent.
    p.add_argument("--child", choices=sorted(CHILD_PHASES), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.selected = [k for k in args.phases.split(",") if k]
    unknown = [k for k in args.selected if k not in PHASE_KEYS]
    if unknown:
        p.error(f"unknown phase(s) {', '.join(unknown)}; phases are {', '.join(PHASE_KEYS)}")
    try:
        args.budgets = parse_phase_budgets(args.phase_budget)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.compile_backend is None:
        args.compile_backend = "eager" if args.tiny else "inductor"
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The check: the phases in order under their time boxes, the summary rewritten after each (or, with
    ``--child``, one phase's body). Exits 0 whatever the phases found."""
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    start = time.monotonic()
    out: Path = args.out.resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in ("summary.txt", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    print(f"fastqa gpu-check: device {args.device}{' (tiny)' if args.tiny else ''}, budget {args.budget_s:.0f} s, "
          f"phases {','.join(args.selected)}, out {out}", flush=True)
    summary: dict[str, Any] = {
        "meta": {"started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                 "tiny": args.tiny, "device": args.device, "budget_s": args.budget_s, "elapsed_s": 0.0,
                 "autotune": args.autotune,
                 "argv": list(argv) if argv is not None else sys.argv[1:], "tolerances": TOLERANCES},
        "environment": collect_environment(args.device), "phases": [], "targets": []}
    for line in environment_lines(summary["environment"]):
        print(line, flush=True)

    def save() -> None:
        summary["meta"]["elapsed_s"] = round(time.monotonic() - start, 1)
        by_key = {p["key"]: p for p in summary["phases"]}
        summary["targets"] = targets(by_key, args.tiny)
        atomic_write_json(out / "summary.json", summary, indent=1, default=str)
        (out / "summary.txt").write_text(render_summary(summary))

    for index, phase in enumerate(PHASES):
        budget = args.budgets.get(phase.key, phase.tiny_budget_s if args.tiny else phase.budget_s)
        least = phase.tiny_min_s if args.tiny else phase.min_s
        record: dict[str, Any] = {"key": phase.key, "title": phase.title, "budget_s": budget}
        summary["phases"].append(record)
        elapsed = time.monotonic() - start
        remaining = args.budget_s - elapsed
        later = sum(args.budgets.get(p.key, p.tiny_budget_s if args.tiny else p.budget_s)
                    for p in PHASES[index + 1:] if p.key in args.selected)
        box = time_box(budget, phase.key in args.budgets, remaining, later)
        record["time_box_s"] = round(box, 1)
        if phase.key not in args.selected:
            record.update(status="skipped", reason=f"not selected (--phases {args.phases})")
        elif remaining <= 0:
            record.update(status="skipped", reason=f"global budget of {args.budget_s:.0f} s spent ({elapsed:.0f} s elapsed)")
        elif box < least:
            record.update(status="skipped", reason=f"only {box:.1f} s of budget for it (phase budget {budget:.0f} s, "
                                                   f"{remaining:.0f} s of the global budget left); it needs at least {least:.0f} s")
        else:
            print(f"\n== phase {phase.key}: {phase.title} (time box {box:.0f} s) ==", flush=True)
            result = run_phase(phase, args, box, logs, out)
            record.update(status=result.pop("status"), reason=result.pop("reason", None),
                          seconds=result.get("seconds"), result=result)
        print(f"phase {phase.key}: {record['status']}" + (f" ({record['reason']})" if record.get("reason") else ""),
              flush=True)
        save()
    save()
    text = (out / "summary.txt").read_text()
    print("\n" + text, flush=True)
    # The phases and targets once more, last: where only the end of the output is kept, this is what survives.
    recap = [line for line in text.splitlines() if line.startswith("phase ") or line.startswith("  ")
             and line.split()[:1] in (["met"], ["missed"], ["unknown"])]
    print("recap:\n" + "\n".join(recap), flush=True)
    print(f"wrote {out / 'summary.txt'} and {out / 'summary.json'}", flush=True)
    # Exit 0 whatever the phases found: what failed is in the summary, and a command chained after this one
    # (packing the logs) must still run.
    return 0
