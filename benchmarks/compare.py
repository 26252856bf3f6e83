"""``python -m benchmarks.compare OLD.json NEW.json``: flag every (op, case, impl, mode) whose median
got more than ``--threshold`` (default 10%) slower. Exit code 1 when any did, 0 otherwise."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .report import load_records

Key = tuple[str, str, str, str]


def _index(records: list[dict]) -> dict[Key, dict]:
    return {(r["op"], r["case"], r["impl"], r["mode"]): r for r in records}


def compare(old: list[dict], new: list[dict], threshold: float = 0.10) -> tuple[list[dict], list[Key], list[Key]]:
    """Rows (key, old_ms, new_ms, change, regression) for the keys in both, sorted worst first;
    then the keys only in old and only in new."""
    a, b = _index(old), _index(new)
    rows = []
    for key in a.keys() & b.keys():
        old_ms, new_ms = a[key]["median_ms"], b[key]["median_ms"]
        change = new_ms / old_ms - 1.0
        rows.append({"key": key, "old_ms": old_ms, "new_ms": new_ms, "change": change,
                     "regression": change > threshold})
    rows.sort(key=lambda r: -r["change"])
    return rows, sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())


def format_rows(rows: list[dict], threshold: float) -> str:
    width = max([len(" ".join(r["key"])) for r in rows] + [20])
    lines = [f"{'op case impl mode':<{width}}{'old ms':>11}{'new ms':>11}{'change':>9}",
             "-" * (width + 31)]
    for r in rows:
        flag = f"  REGRESSION (> {threshold:.0%} slower)" if r["regression"] else ""
        lines.append(f"{' '.join(r['key']):<{width}}{r['old_ms']:>11.3f}{r['new_ms']:>11.3f}{r['change']:>+9.1%}{flag}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__)
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--threshold", type=float, default=0.10, help="relative slowdown that counts as a regression")
    args = p.parse_args(argv)
    rows, only_old, only_new = compare(load_records(args.old), load_records(args.new), args.threshold)
    if rows:
        print(format_rows(rows, args.threshold))
    for label, keys in (("only in OLD (not compared)", only_old), ("only in NEW (not compared)", only_new)):
        if keys:
            print(f"\n{label}:\n" + "\n".join("  " + " ".join(k) for k in keys))
    regressions = sum(r["regression"] for r in rows)
    print(f"\n{len(rows)} compared, {regressions} regression(s) above {args.threshold:.0%}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
