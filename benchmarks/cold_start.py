"""``python -m benchmarks.cold_start``: how long a first answer takes, from process start.

1. ``fastqa ask --context ... --question ...`` with the shipped reader on a 150-word context, run ``--runs``
   times as a new process each (after one untimed run that warms the file cache): median and spread of the
   wall time, process start to exit.
2. The same path in one fresh process, timed step by step (interpreter start, ``import torch``, the command
   line, ``QAModel.load``, the tokenizer's first use, the first answer), so that a regression says where.

Writes ``--out`` (JSON) and prints a line per measurement, with the machine's CPU. Run it on an idle machine:
a busy one measures its neighbours.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.measure import device_name
from benchmarks.serve import CONTEXT

QUESTION = "Who designed the tower?"

# The steps of a first answer, each printed with its time since the process started (``time.perf_counter`` is
# not process-relative, so the start is taken from the OS: the process's own creation time).
_STEPS = r'''
import os, sys, time
start = float(sys.argv[1])
def mark(name):
    print(f"{name}\t{time.time() - start:.4f}", flush=True)
mark("interpreter started")
import torch
mark("import torch")
from fastqa.tasks.qa import QAModel
mark("import fastqa's reader")
qa = QAModel.load(device="cpu", threads=1)
mark("QAModel.load (shipped reader)")
from fastqa.data.tokenize import tokenize
tokenize("warm up")
mark("tokenizer loaded (spaCy)")
qa.answer(sys.argv[2], sys.argv[3])
mark("first answer")
'''


def end_to_end(runs: int) -> dict:
    cmd = [sys.executable, "-m", "fastqa", "ask", "--context", CONTEXT, "--question", QUESTION]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run(cmd, check=True, capture_output=True, env=env)  # warms the file cache
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - t0)
    return {"runs": runs, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "context_words": len(CONTEXT.split())}


def steps() -> list[tuple[str, float]]:
    out = subprocess.run([sys.executable, "-c", _STEPS, repr(time.time()), CONTEXT, QUESTION], check=True,
                         capture_output=True, text=True).stdout
    return [(name, float(t)) for name, t in (line.split("\t") for line in out.splitlines() if "\t" in line)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cold_start", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench-results") / "cold-start.json")
    args = p.parse_args(argv)
    result = {"cpu": device_name(torch.device("cpu")), "date": time.strftime("%Y-%m-%d"), "ask": end_to_end(args.runs),
              "steps": steps()}
    a = result["ask"]
    print(f"fastqa ask, {a['context_words']}-word context, process start to exit ({result['cpu']}): median "
          f"{a['median_s']:.2f} s (min {a['min_s']:.2f}, max {a['max_s']:.2f}, {a['runs']} runs)")
    previous = 0.0
    for name, t in result["steps"]:
        print(f"  {t:6.2f} s  (+{t - previous:4.2f})  {name}")
        previous = t
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
