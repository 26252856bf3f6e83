"""``python -m benchmarks.serve``: the shipped reader as a user meets it.

1. ``QAModel.answer`` warm latency for one question on a 150-word context (median and p90 of N calls, after
   warm-up) in this process;
2. ``fastqa serve`` started as a subprocess on 127.0.0.1, then ``--requests`` concurrent ``POST /answer``
   requests from ``--clients`` threads: errors, p50 / p99 latency, requests per second.

Writes ``--out`` (JSON) and prints one summary line per measurement. Needs the shipped reader (or ``--model``)
and the ``serve`` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

CONTEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after the "
    "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed "
    "La dame de fer, it was constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial "
    "anniversary of the French Revolution. Although initially criticised by some of France's leading artists "
    "and intellectuals for its design, it has since become a global cultural icon of France and one of the most "
    "recognisable structures in the world. The tower received 5,889,000 visitors in 2022. It is 330 metres tall, "
    "about the same height as an 81-storey building, and the tallest structure in Paris. Its base is square, "
    "measuring 125 metres on each side. During its construction, the Eiffel Tower surpassed the Washington "
    "Monument to become the tallest human-made structure in the world, a title it held for 41 years."
)
QUESTIONS = ["When was the Eiffel Tower built?", "Who designed the tower?", "How tall is the tower?",
             "How many visitors did the tower receive in 2022?", "Where is the Eiffel Tower?"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def answer_latency(model: str | None, calls: int, threads: int) -> dict:
    from fastqa.tasks.qa import QAModel

    torch.set_num_threads(threads)
    qa = QAModel.load(model, device="cpu")
    for q in QUESTIONS:  # warm-up: first calls allocate and pick GEMM engines
        qa.answer(CONTEXT, q)
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        qa.answer(CONTEXT, QUESTIONS[i % len(QUESTIONS)])
        times.append((time.perf_counter() - t0) * 1e3)
    return {"context_words": len(CONTEXT.split()), "calls": calls, "threads": threads,
            "median_ms": statistics.median(times), "p90_ms": _percentile(times, 0.9)}


def _post(url: str, body: dict) -> tuple[int, float]:
    data = json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        status = e.code
    return status, (time.perf_counter() - t0) * 1e3


def serve_load(model: str | None, requests: int, clients: int, threads: int) -> dict:
    cmd = [sys.executable, "-m", "fastqa", "serve", "--port", "0", "--threads", str(threads), "--device", "cpu"]
    if model is not None:
        cmd += ["--qa-model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _wait_for_url(proc)
        _post(url + "/answer", {"context": CONTEXT, "question": QUESTIONS[0]})  # warm-up
        bodies = [{"context": CONTEXT, "question": QUESTIONS[i % len(QUESTIONS)], "top_k": 3} for i in range(requests)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(lambda b: _post(url + "/answer", b), bodies))
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    latencies = [ms for status, ms in results if status == 200]
    return {"requests": requests, "clients": clients, "threads": threads,
            "errors": sum(status != 200 for status, _ in results),
            "p50_ms": _percentile(latencies, 0.5) if latencies else None,
            "p99_ms": _percentile(latencies, 0.99) if latencies else None,
            "requests_per_s": len(latencies) / wall}


def _wait_for_url(proc: subprocess.Popen) -> str:
    """The server's address, from the first line it prints (``--port 0`` picks a free port)."""
    found: list[str] = []

    def read() -> None:
        line = proc.stdout.readline()
        found.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=120)
    line = found[0] if found else ""
    for word in line.split():
        if word.startswith("http://"):
            return word.rstrip("/")
    raise RuntimeError(f"fastqa serve did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a reader (default: the shipped one)")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench-results") / "serve.json")
    args = p.parse_args(argv)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    result = {"cpu": cpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "answer": answer_latency(args.model, args.calls, args.threads),
              "serve": serve_load(args.model, args.requests, args.clients, args.threads)}
    a, s = result["answer"], result["serve"]
    print(f"QAModel.answer, {a['context_words']}-word context, {a['threads']} threads: median {a['median_ms']:.1f} ms, "
          f"p90 {a['p90_ms']:.1f} ms ({a['calls']} calls)")
    print(f"fastqa serve /answer, {s['requests']} requests from {s['clients']} clients: {s['errors']} errors, "
          f"p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, {s['requests_per_s']:.1f} requests/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if s["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
