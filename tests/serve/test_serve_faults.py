"""Faults injected into ``fastqa serve``, nothing hangs: a worker process killed under load (the others keep
answering, the supervisor starts a new one, only the requests it held fail), and, in one batch, a request that
times out and a client that disconnects (the batch still answers the others)."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
import urllib.error
from pathlib import Path

from serve_helpers import start_server, stop_server

REQUEST_TIMEOUT_S = 30   # a client waiting longer than this counts as a hung request


def _pairs(serve_models) -> list[tuple[str, str]]:
    return [(p["context"], q["question"]) for article in serve_models["squad"]["data"]
            for p in article["paragraphs"] for q in p["qas"]]


def _metric(text: str, name: str, labels: str) -> float:
    """The sum of a Prometheus metric's samples named ``name`` whose labels contain ``labels`` (0 before the
    first: a labelled metric has no sample until then)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and labels in line)


def _workers(server_pid: int) -> list[int]:
    """The pids of the server's worker processes (its children started by multiprocessing, not its helpers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server_pid and b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def test_a_worker_killed_under_load_fails_only_what_it_held(serve_models, tmp_path):
    running = start_server(["--qa-model", str(serve_models["qa"]), "--workers", "2"], tmp_path / "server.log")
    clients = 6
    try:
        deadline = time.monotonic() + 60
        while len(_workers(running.process.pid)) < 2:
            assert time.monotonic() < deadline, "the server has no 2 workers"
            time.sleep(0.1)
        before = _workers(running.process.pid)
        pairs = _pairs(serve_models)
        outcomes: list[tuple[float, float, str]] = []   # (sent, finished, "200" / "5xx" status / error name)
        stop = threading.Event()

        def client(k: int) -> None:
            i = k
            while not stop.is_set():
                context, question = pairs[i % len(pairs)]
                i += clients
                sent = time.monotonic()
                try:
                    status, _ = running.post("/answer", {"context": context, "question": question},
                                             timeout=REQUEST_TIMEOUT_S)
                    outcome = str(status)
                except (OSError, http.client.HTTPException) as e:  # the connection the dead worker held
                    outcome = type(e.reason if isinstance(e, urllib.error.URLError) else e).__name__
                outcomes.append((sent, time.monotonic(), outcome))

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        victim = before[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        # Load goes on while the supervisor notices and starts a new worker (which loads the model).
        restarted = None
        while time.monotonic() < killed + 60:
            now = _workers(running.process.pid)
            if len(now) == 2 and victim not in now:
                restarted = time.monotonic() - killed
                break
            time.sleep(0.1)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 5)
        assert not any(t.is_alive() for t in threads), "a request hung"
        assert restarted is not None, f"no worker replaced the killed one: {_workers(running.process.pid)}"

        failed = [o for o in outcomes if o[2] != "200"]
        after = [o for o in outcomes if o[0] > killed]
        # Only requests already sent when the worker died failed, at most one per client (each client has one
        # request in flight); every request sent after it was answered, by the surviving worker or the new one.
        assert len(failed) <= clients and all(sent < killed for sent, _, _ in failed), failed
        assert all(o[2] == "200" for o in after) and len(after) >= clients, after
        assert max(done - sent for sent, done, _ in outcomes) < REQUEST_TIMEOUT_S
        print(f"\nworker killed under load: {len(outcomes)} requests, {len(failed)} failed "
              f"({', '.join(sorted({o[2] for o in failed})) or 'none'}), {len(after)} sent after the kill all "
              f"answered; a new worker {restarted:.1f} s after the kill")
        assert running.get("/health")[0] == 200
    finally:
        stop_server(running)


def _raw_post(port: int, body: bytes, *, send: int | None = None) -> socket.socket:
    """A POST /answer on a raw socket, of which only the first ``send`` bytes of the body go out."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S)
    head = (f"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body[:send])
    return sock


def test_a_timeout_and_a_disconnect_leave_the_rest_of_their_batch_answered(serve_models, tmp_path):
    """One batch collects for 3 s from its first request: that request times out after 2 s (504) while the
    others, which joined at 1.8 s, wait in the same batch; one of them disconnects before the batch runs and one
    client stops in the middle of its body. The batch then answers the three others, and the one whose client
    left, in one model call."""
    running = start_server(["--qa-model", str(serve_models["qa"]), "--max-wait-ms", "3000", "--idle-ms", "3000",
                            "--timeout-s", "2"], tmp_path / "server.log")
    try:
        port = int(running.url.rsplit(":", 1)[1])
        (context, question), *others = _pairs(serve_models)[:4]
        metrics = running.request("GET", "/metrics")[1]
        batches, answered = (_metric(metrics, f"fastqa_batch_size_{s}", 'model="qa"') for s in ("count", "sum"))
        results: dict[str, tuple] = {}

        def post(name: str, c: str, q: str) -> None:
            results[name] = running.post("/answer", {"context": c, "question": q}, timeout=REQUEST_TIMEOUT_S)

        first = threading.Thread(target=post, args=("first", context, question))
        t0 = time.monotonic()
        first.start()
        time.sleep(1.8)
        threads = [threading.Thread(target=post, args=(f"other{k}", c, q)) for k, (c, q) in enumerate(others[:3])]
        body = json.dumps({"context": others[0][0], "question": others[0][1]}).encode()
        leaving = _raw_post(port, body)                       # whole request sent, then the client goes
        halfway = _raw_post(port, body, send=len(body) // 2)  # the client goes in the middle of its body
        for t in threads:
            t.start()
        time.sleep(0.3)
        leaving.close()
        halfway.close()
        for t in [first, *threads]:
            t.join(REQUEST_TIMEOUT_S)
        took = time.monotonic() - t0
        assert not any(t.is_alive() for t in [first, *threads]), "a request hung"
        status, body_first = results["first"]
        assert status == 504 and "did not answer within 2 s" in body_first["error"], results["first"]
        for k in range(3):
            status, payload = results[f"other{k}"]
            assert status == 200 and payload["answers"], payload
        assert took < 10
        # One model call answered the three and the request whose client left; the timed-out one left the queue.
        deadline = time.monotonic() + 10
        while True:
            metrics = running.request("GET", "/metrics")[1]
            new_batches = _metric(metrics, "fastqa_batch_size_count", 'model="qa"') - batches
            new_answered = _metric(metrics, "fastqa_batch_size_sum", 'model="qa"') - answered
            if new_batches or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (new_batches, new_answered) == (1, 4), metrics
        assert running.get("/health")[0] == 200
        assert "Traceback" not in running.log.read_text()
    finally:
        stop_server(running)
