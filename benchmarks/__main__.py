"""``python -m benchmarks`` (``make bench``): time every case, print the table, write results.json and
speedup.png under ``--out``."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from fastqa.data.files import atomic_write_json, atomic_write_text

from . import measure, registry, report, runner


def _split(values: list[str] | None) -> list[str] | None:
    """``--ops a,b c`` -> [a, b, c]."""
    return None if not values else [v for arg in values for v in arg.split(",") if v]


def _naive_limit(device: torch.device, limit_gib: float) -> float:
    """At most ``limit_gib``, and at most 40% of the memory free right now."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            with open("/proc/meminfo") as f:
                free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
        except (OSError, StopIteration):
            free = float("inf")
    return min(limit_gib * 2 ** 30, 0.4 * free)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="the quick cases only, 10 timed runs each, torch.compile on one (case, mode) per op")
    p.add_argument("--models", action="store_true",
                   help="also the model cases (QANet, ConvS2S: minutes each); naming them in --ops/--cases also works")
    p.add_argument("--ops", nargs="+", help="only these ops (names or comma lists)")
    p.add_argument("--cases", nargs="+", help="only cases whose id (op/name) contains one of these")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="where results.json and speedup.png go")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--compile-per-op", type=int, default=None,
                   help="torch.compile the first N (case, mode) pairs of each op; -1: all "
                        "(default: all, 1 with --quick)")
    p.add_argument("--target-s", type=float, default=None,
                   help="timed seconds per implementation and (case, mode) (default: 1.0; 0 with --quick)")
    p.add_argument("--min-runs", type=int, default=10, help="at least this many timed runs")
    p.add_argument("--naive-limit-gib", type=float, default=4.0,
                   help="skip a naive baseline whose estimated peak memory is above this")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--quick-peaks", action="store_true",
                   help="measure the machine's GEMM and bandwidth roofs on small sizes (a smoke test: the bounds "
                        "and their ratios are then not meaningful)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    args = p.parse_args(argv)
    if args.min_runs < 10:
        p.error("--min-runs must be at least 10")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cases = registry.select(_split(args.ops), _split(args.cases), quick=args.quick, models=args.models)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list or not cases:
        for c in cases:
            print(f"{c.id:<55} modes: {', '.join(c.modes)}{'  (quick)' if c.quick else ''}")
        if not cases:
            print("no case matches the filters", file=sys.stderr)
        return 0 if cases else 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    settings = dataclasses.replace(measure.QUICK if args.quick else measure.Settings())
    settings.min_runs = args.min_runs
    settings.max_runs = max(settings.max_runs, settings.min_runs)
    if args.target_s is not None:
        settings.target_s = args.target_s
    settings.memory = not args.no_memory
    compile_per_op = args.compile_per_op if args.compile_per_op is not None else (1 if args.quick else -1)

    args.out.mkdir(parents=True, exist_ok=True)

    def save_partial(partial: dict) -> None:
        # Atomically: a run killed at its time limit leaves the last complete save.
        atomic_write_json(args.out / "results.json", partial, indent=1)

    result = runner.run(cases, device=device, dtype=dtype, settings=settings,
                        compile_per_op=None if compile_per_op < 0 else compile_per_op,
                        naive_limit_bytes=_naive_limit(device, args.naive_limit_gib),
                        progress=not args.no_progress,
                        peaks=measure.machine_peaks(device, dtype, quick=True) if args.quick_peaks else None,
                        on_case=save_partial)
    atomic_write_json(args.out / "results.json", result, indent=1)
    atomic_write_text(args.out / "results.md", report.markdown(result) + "\n")
    print(report.table(result))
    if result["records"]:
        report.speedup_chart(result, args.out / "speedup.png")
    print(f"\nwrote {args.out / 'results.json'}" + (f" and {args.out / 'speedup.png'}" if result["records"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
