"""``python -m benchmarks.serve``: the shipped models as a user meets them, and what dynamic batching buys.

1. ``QAModel.answer`` warm latency for one question on a 150-word context (median and p90 of N calls, after
   warm-up) in this process;
2. ``fastqa serve`` started as a subprocess on 127.0.0.1, then bursts of ``--requests`` concurrent
   ``POST /answer`` requests (one client thread each, connected first, all sent at once): one burst to warm the
   server up, then ``--rounds`` measured ones -- errors, p50 / p99 latency over all their requests (and each
   burst's p99), requests per second, and the batch sizes the server ran (its /metrics) -- with batching (serve's
   ``--max-batch`` and ``--max-wait-ms``, or the ones given) and one request at a time (``--max-batch 1``), in the
   same run;
3. the same for ``POST /translate``: bursts of ``--requests`` concurrent single sentences, beam 5.

Writes ``--out`` (JSON) and prints one summary line per measurement. Needs the shipped models (or ``--model``,
``--mt-model``) and the ``serve`` extra.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks.measure import device_name
from fastqa.data.files import atomic_write_json
from fastqa.serve.limits import ServeLimits

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
SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.",
             "Ein kleines Mädchen klettert auf einen Baum.", "Drei Männer arbeiten auf einer Baustelle.",
             "Ein Junge springt in einen See.", "Eine Gruppe von Menschen steht vor einem Gebäude."]


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


def _post(url: str, body: dict, start: threading.Barrier | None = None) -> tuple[int, float]:
    """``body`` posted to ``url``: (the status, milliseconds from sending the request to reading the whole
    answer). With ``start``, the connection is opened first and the request sent once ``start`` releases it, as
    a client that keeps its connection (a browser, a proxy) sends."""
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode("utf-8")
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        connection.connect()
        if start is not None:
            start.wait()
        t0 = time.perf_counter()
        connection.request("POST", parts.path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status, (time.perf_counter() - t0) * 1e3
    finally:
        connection.close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode("utf-8")


def batch_sizes(metrics: str, model: str) -> dict[str, float]:
    """The server's batches of ``model`` from its Prometheus text: how many ran with at most each bucket's
    size (``le``), their count and mean size."""
    buckets = {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'^fastqa_batch_size_bucket{{le="([^"]+)",model="{model}"}} (\S+)$', metrics, flags=re.M)}
    if not buckets:  # label order may differ
        buckets = {m.group(1): float(m.group(2)) for m in re.finditer(
            rf'^fastqa_batch_size_bucket{{model="{model}",le="([^"]+)"}} (\S+)$', metrics, flags=re.M)}
    count = sum(float(m.group(1)) for m in re.finditer(
        rf'^fastqa_batch_size_count{{model="{model}"}} (\S+)$', metrics, flags=re.M))
    total = sum(float(m.group(1)) for m in re.finditer(
        rf'^fastqa_batch_size_sum{{model="{model}"}} (\S+)$', metrics, flags=re.M))
    return {"batches": count, "mean_size": total / count if count else 0.0, "at_most": buckets}


def serve_load(route: str, bodies: list[dict], *, max_batch: int, threads: int, model_flags: list[str],
               warm: dict, precision: str = "fp32", max_wait_ms: float | None = None, rounds: int = 3) -> dict:
    """``fastqa serve --max-batch max_batch --precision precision`` under bursts of ``len(bodies)`` concurrent
    requests to ``route``: one burst to warm up (the batch shapes seen for the first time, the allocator), then
    ``rounds`` measured ones; latencies pooled over the measured rounds."""
    cmd = [sys.executable, "-m", "fastqa", "serve", "--port", "0", "--threads", str(threads), "--device", "cpu",
           "--max-batch", str(max_batch), "--precision", precision, "--log-level", "warning", *model_flags]
    if max_wait_ms is not None:
        cmd += ["--max-wait-ms", str(max_wait_ms)]
    model = route.strip("/").replace("answer", "qa").replace("translate", "translation")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _wait_for_url(proc)
        for _ in range(3):  # warm-up: first calls allocate and pick GEMM engines
            _post(url + route, warm)
        _burst(url + route, bodies)
        before = batch_sizes(_get(url + "/metrics"), model)
        bursts = [_burst(url + route, bodies) for _ in range(rounds)]
        after = batch_sizes(_get(url + "/metrics"), model)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    results = [r for _, burst in bursts for r in burst]
    wall = sum(seconds for seconds, _ in bursts)
    latencies = [ms for status, ms in results if status == 200]
    batches = after["batches"] - before["batches"]
    return {"route": route, "requests": len(results), "concurrent": len(bodies), "rounds": rounds,
            "max_batch": max_batch, "max_wait_ms": max_wait_ms, "precision": precision, "threads": threads,
            "errors": sum(status != 200 for status, _ in results),
            "p50_ms": _percentile(latencies, 0.5) if latencies else None,
            "p99_ms": _percentile(latencies, 0.99) if latencies else None,
            "round_p99_ms": [_percentile([ms for status, ms in burst if status == 200] or [float("nan")], 0.99)
                             for _, burst in bursts],
            "requests_per_s": len(latencies) / wall, "batches": batches,
            "mean_batch": len(results) / batches if batches else None,
            "batch_sizes_at_most": {le: after["at_most"].get(le, 0) - before["at_most"].get(le, 0)
                                    for le in after["at_most"]}}


def _burst(url: str, bodies: list[dict]) -> tuple[float, list[tuple[int, float]]]:
    """All ``bodies`` posted at once, a client thread each: the seconds until the last answer, and each request's
    (status, milliseconds)."""
    start = threading.Barrier(len(bodies) + 1)
    with ThreadPoolExecutor(len(bodies)) as pool:
        sent = [pool.submit(_post, url, body, start) for body in bodies]
        start.wait()  # every client connected
        t0 = time.perf_counter()
        results = [future.result() for future in sent]
    return time.perf_counter() - t0, results


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


def _line(r: dict) -> str:
    how = "one at a time" if r["max_batch"] == 1 else f"batches of at most {r['max_batch']}"
    how += f", {r['precision']}"
    return (f"fastqa serve {r['route']}, {r['rounds']} bursts of {r['concurrent']} concurrent requests, {how}: "
            f"{r['errors']} errors, "
            f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, {r['requests_per_s']:.1f} requests/s, "
            f"{r['batches']:.0f} model calls (mean batch {r['mean_batch'] or 0:.1f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a reader (default: the shipped one)")
    p.add_argument("--mt-model", default=None, help="a translator (default: the shipped one)")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--requests", type=int, default=100, help="concurrent requests per measurement (default 100)")
    p.add_argument("--max-batch", type=int, default=None, help="the batched runs' --max-batch (default: serve's)")
    p.add_argument("--max-wait-ms", type=float, default=None, help="the batched runs' --max-wait-ms (default: serve's)")
    p.add_argument("--rounds", type=int, default=3, help="measured bursts per run, after one to warm up (default 3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="the batched runs' --precision (the one-at-a-time baseline is fp32)")
    p.add_argument("--skip", choices=("answer", "translate"), action="append", default=[])
    p.add_argument("--out", type=Path, default=Path("bench-results") / "serve.json")
    args = p.parse_args(argv)
    batched = args.max_batch or ServeLimits().max_batch
    result: dict = {"cpu": device_name(torch.device("cpu")), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d"), "serve": []}
    if "answer" not in args.skip:
        a = result["answer"] = answer_latency(args.model, args.calls, args.threads)
        print(f"QAModel.answer, {a['context_words']}-word context, {a['threads']} threads: median "
              f"{a['median_ms']:.1f} ms, p90 {a['p90_ms']:.1f} ms ({a['calls']} calls)", flush=True)
    loads = []
    if "answer" not in args.skip:
        loads.append(("/answer", ["--qa-model", args.model or "qanet-small-squad"],
                      [{"context": CONTEXT, "question": QUESTIONS[i % len(QUESTIONS)], "top_k": 3}
                       for i in range(args.requests)]))
    if "translate" not in args.skip:
        loads.append(("/translate", ["--mt-model", args.mt_model or "convs2s-small-multi30k"],
                      [{"text": SENTENCES[i % len(SENTENCES)], "beam": 5} for i in range(args.requests)]))
    for route, flags, bodies in loads:
        for max_batch in (1, batched):  # one at a time, then batched: the same run, the same machine
            r = serve_load(route, bodies, max_batch=max_batch, threads=args.threads, model_flags=flags,
                           warm=bodies[0], precision="fp32" if max_batch == 1 else args.precision,
                           max_wait_ms=None if max_batch == 1 else args.max_wait_ms, rounds=args.rounds)
            result["serve"].append(r)
            print(_line(r), flush=True)
    for route in ("/answer", "/translate"):
        runs = {r["max_batch"]: r for r in result["serve"] if r["route"] == route}
        if len(runs) == 2:
            ratio = runs[batched]["requests_per_s"] / runs[1]["requests_per_s"]
            result[f"{route.strip('/')}_speedup"] = ratio
            print(f"{route}: batching gives {ratio:.2f}x the throughput of one request at a time", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    return 0 if all(r["errors"] == 0 for r in result["serve"]) else 1


if __name__ == "__main__":
    sys.exit(main())
