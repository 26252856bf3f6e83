"""The HTTP API of ``fastqa serve`` over real HTTP: the command serving two tiny models from a subprocess
(/health, /answer, /translate, /metrics, concurrent requests batched, every kind of bad request, SIGTERM while
requests are in flight, several worker processes), and applications served from a thread of the test process
for what needs its own set-up (one model only, a full queue, a timeout)."""
from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_helpers import serve_in_thread, start_server, stop_server

from fastqa.serve.app import create_app
from fastqa.serve.limits import ServeLimits


def _paragraphs(serve_models) -> list[dict]:
    return [p for article in serve_models["squad"]["data"] for p in article["paragraphs"]]


def _pairs(serve_models, n: int) -> list[tuple[str, str]]:
    return [(p["context"], q["question"]) for p in _paragraphs(serve_models) for q in p["qas"]][:n]


def _assert_error(status: int, body, want_status: int, pattern: str, field: str | None = None) -> None:
    """A JSON error: {"error": a message matching pattern, "status": want_status[, "field"]}."""
    assert status == want_status, (status, body)
    assert isinstance(body, dict) and body["status"] == want_status, body
    assert re.search(pattern, body["error"]), body["error"]
    if field is not None:
        assert body.get("field") == field, body


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples named exactly ``name`` (any labels)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"no {name} in /metrics"
    return sum(values)


# ------------------------------------------------------------------------------------------ the routes

def test_health_names_the_loaded_models_and_the_queues(server, serve_models):
    status, body = server.get("/health")
    assert status == 200 and body["status"] == "ok"
    assert body["models"]["qa"]["path"] == str(serve_models["qa"]) and body["models"]["qa"]["model"] == "QANet"
    assert body["models"]["qa"]["calibrated"] is False
    assert body["models"]["qa"]["dtype"] == body["models"]["translation"]["dtype"] == "float32"
    assert body["models"]["translation"]["path"] == str(serve_models["mt"])
    assert body["models"]["translation"]["vocab"] == "word"
    assert body["limits"] == ServeLimits().to_dict()
    assert body["queue"] == {"qa": 0, "translation": 0}


def test_answer_matches_the_python_api(server, serve_models):
    from fastqa.tasks.qa import QAModel

    qa = QAModel.load(serve_models["qa"], device="cpu")
    para = _paragraphs(serve_models)[1]
    for item in para["qas"][:3]:
        status, body = server.post("/answer", {"context": para["context"], "question": item["question"], "top_k": 5})
        assert status == 200, body
        want = qa.answer(para["context"], item["question"], top_k=5)
        assert [(a["text"], a["start"], a["end"]) for a in body["answers"]] == [(a.text, a.start, a.end) for a in want]
        assert [a["score"] for a in body["answers"]] == pytest.approx([a.score for a in want], rel=1e-4)
        assert body["answer"] == body["answers"][0]
        assert set(body["answer"]) == {"text", "start", "end", "score", "no_answer_prob", "abstained"}
        assert all(para["context"][a["start"]:a["end"]] == a["text"] for a in body["answers"])
        assert 1 <= len(body["answers"]) <= 5                   # distinct answers: none overlaps a better one
    # max_answer_len 0: one-token answers only
    status, body = server.post("/answer", {"context": para["context"], "question": para["qas"][0]["question"],
                                           "top_k": 3, "max_answer_len": 0})
    assert status == 200 and all(" " not in a["text"].strip() for a in body["answers"])


def test_min_score_gives_no_confident_answer(server, serve_models):
    para = _paragraphs(serve_models)[0]
    request = {"context": para["context"], "question": para["qas"][0]["question"]}
    status, best = server.post("/answer", request)
    assert status == 200 and not best["answer"]["abstained"]
    status, body = server.post("/answer", {**request, "min_score": 1.0, "top_k": 3})
    assert status == 200, body
    assert body["answers"] == [body["answer"]]
    assert body["answer"]["abstained"] is True and body["answer"]["text"] == ""
    assert body["answer"]["score"] == pytest.approx(best["answer"]["score"], rel=1e-4)
    status, body = server.post("/answer", {**request, "min_score": 0.0})
    assert status == 200 and body["answer"] == best["answer"]


def test_translate_text_sentences_nbest_and_attention(server, serve_models):
    from fastqa.tasks.translation import Translator

    tr = Translator.load(serve_models["mt"], device="cpu")
    status, body = server.post("/translate", {"text": "ka lo mi nu"})
    assert status == 200, body
    (row,) = body["translations"]
    (want,) = tr.translate(["ka lo mi nu"], beam=5)
    assert (row["source"], row["text"], row["tokens"]) == ("ka lo mi nu", want.text, want.tokens)
    assert row["score"] == pytest.approx(want.score, rel=1e-4) and row["attention"] is None
    sentences = ["ka lo mi", "", "nu po ri sa tu"]
    status, body = server.post("/translate", {"sentences": sentences, "beam": 3, "nbest": 2, "attention": True})
    assert status == 200, body
    rows = body["translations"]
    assert [r["source"] for r in rows] == sentences
    assert [r["text"] for r in rows] == [t.text for t in tr.translate(sentences, beam=3)]
    assert rows[1]["text"] == "" and rows[1]["attention"] is None and rows[1]["alternatives"] == []
    for r in (rows[0], rows[2]):
        amap = r["attention"]
        assert amap["source"] == [*r["source"].split(), "<eos>"] and amap["target"] == [*r["tokens"], "<eos>"]
        assert all(len(w) == len(amap["source"]) and sum(w) == pytest.approx(1, abs=1e-3) for w in amap["weights"])
        assert len(r["alternatives"]) == 1 and r["alternatives"][0]["score"] <= r["score"]


def test_the_page_and_the_openapi_description(server):
    status, page, headers = server.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "<script>" in page and "<style>" in page
    assert "http://" not in page and "https://" not in page and "src=" not in page  # nothing from elsewhere
    status, spec = server.get("/openapi.json")
    assert status == 200 and {"/answer", "/translate", "/health"} <= set(spec["paths"])
    request = spec["components"]["schemas"]["AnswerRequest"]
    assert set(request["required"]) == {"context", "question"}
    assert request["properties"]["context"]["maxLength"] == ServeLimits().max_context_chars


# ------------------------------------------------------------------------------------------ batching

def test_concurrent_requests_are_batched_with_the_answers_of_one_at_a_time(server, serve_models):
    pairs = _pairs(serve_models, 24)
    one_at_a_time = [server.post("/answer", {"context": c, "question": q, "top_k": 2}) for c, q in pairs]
    assert all(status == 200 for status, _ in one_at_a_time)
    batches_before = _metric(server.request("GET", "/metrics")[1], "fastqa_batch_size_count")
    start = threading.Barrier(len(pairs) + 2)

    def ask(pair):
        start.wait()
        return server.post("/answer", {"context": pair[0], "question": pair[1], "top_k": 2})

    def translate():
        start.wait()
        return server.post("/translate", {"sentences": ["ka lo mi", "nu po"], "attention": True})

    def health():
        start.wait()
        return server.get("/health")

    with ThreadPoolExecutor(len(pairs) + 2) as pool:
        answers = [pool.submit(ask, pair) for pair in pairs]
        others = [pool.submit(translate), pool.submit(health)]
        results = [f.result(timeout=300) for f in answers]
        assert all(f.result(timeout=300)[0] == 200 for f in others)
    for (status, body), (_, alone) in zip(results, one_at_a_time):
        assert status == 200, body
        # Batched with others, padded to their lengths: the same spans, the same scores to float32 rounding.
        assert [(a["text"], a["start"], a["end"]) for a in body["answers"]] == \
            [(a["text"], a["start"], a["end"]) for a in alone["answers"]]
        assert [a["score"] for a in body["answers"]] == pytest.approx([a["score"] for a in alone["answers"]], rel=1e-4)
    metrics = server.request("GET", "/metrics")[1]
    # Fewer model calls than requests: the concurrent ones were answered together.
    calls = _metric(metrics, "fastqa_batch_size_count") - batches_before
    assert 1 <= calls < len(pairs) + 1, calls
    assert _metric(metrics, "fastqa_requests_total") >= 2 * len(pairs)


def test_metrics_are_prometheus_text(server):
    server.get("/health")
    status, text, headers = server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("fastqa_requests_total", "fastqa_request_seconds_bucket", "fastqa_batch_size_bucket",
                 "fastqa_queue_depth"):
        assert re.search(rf"^{name}{{", text, flags=re.M), name
    assert re.search(r'^fastqa_requests_total\{route="/health",status="200"\} [1-9]', text, flags=re.M)


# ------------------------------------------------------------------------------------------ bad requests

@pytest.mark.parametrize("raw,status,pattern", [
    (b'{"context": "a b", "question": ', 400, "malformed JSON"),
    (b"", 400, "empty"),
    (b"\xff\xfe{}", 400, "malformed JSON"),
    (b"[1, 2]", 422, "expected a JSON object"),
    (b'"just text"', 422, "expected a JSON object"),
])
def test_malformed_bodies(server, raw, status, pattern):
    got, body, headers = server.request("POST", "/answer", raw=raw)
    _assert_error(got, body, status, pattern)
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("payload,pattern,field", [
    ({"context": "Ada was born in Kraków."}, "question: Field required", "question"),
    ({"question": "Where?"}, "context: Field required", "context"),
    ({"context": "Ada was born in Kraków.", "question": 3}, "question: Input should be a valid string", "question"),
    ({"context": ["Ada"], "question": "Where?"}, "context: Input should be a valid string", "context"),
    ({"context": "Ada was born.", "question": "   "}, "question: the question is empty", "question"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": "5"}, "top_k: Input should be a valid integer", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": 2.5}, "top_k: Input should be a valid integer", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": True}, "top_k: Input should be a valid integer", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": 0}, "top_k: .*greater than or equal to 1", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": 21}, "top_k: .*less than or equal to 20", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "min_score": 1.5}, "min_score: .*less than or equal to 1",
     "min_score"),
    ({"context": "Ada was born.", "questoin": "Who?"}, "questoin: unknown field", "questoin"),
    ({"context": "x " * 10_001, "question": "Who?"}, "context: .*at most 20000 characters", "context"),
])
def test_bad_answer_requests_are_422_naming_the_field(server, payload, pattern, field):
    _assert_error(*server.post("/answer", payload), 422, pattern, field)


@pytest.mark.parametrize("payload,pattern", [
    ({}, "either 'text'"),
    ({"text": "ka", "sentences": ["ka"]}, "either 'text'"),
    ({"sentences": "ka lo"}, "sentences: Input should be a valid list"),
    ({"sentences": []}, "sentences: List should have at least 1 item"),
    ({"sentences": ["ka", 7]}, r"sentences\.1: Input should be a valid string"),
    ({"sentences": ["ka"] * 65}, "sentences: List should have at most 64 items"),
    ({"text": "ka", "beam": 0}, "beam: .*greater than or equal to 1"),
    ({"text": "ka", "beam": 17}, "beam: .*less than or equal to 16"),
    ({"text": "ka", "beam": 2, "nbest": 3}, r"nbest \(3\) must be at most beam \(2\)"),
    ({"text": "ka", "attention": "yes"}, "attention: Input should be a valid boolean"),
    ({"text": "ka " * 1000}, "text: .*at most 2000 characters"),
    ({"sentences": ["ka " * 1000]}, "sentence 0: 3000 characters"),
])
def test_bad_translate_requests_are_422(server, payload, pattern):
    _assert_error(*server.post("/translate", payload), 422, pattern)


def test_text_that_is_not_unicode_is_422(server):
    # A lone surrogate is valid JSON (an escape) but not text.
    raw = b'{"context": "Ada was born in \\ud800 Krak\\u00f3w.", "question": "Where?"}'
    _assert_error(*server.request("POST", "/answer", raw=raw)[:2], 422, "context: .*unicode", "context")


def test_an_oversized_body_is_413(server):
    body = json.dumps({"context": "a " * 600_000, "question": "Who?"}).encode()
    assert len(body) > ServeLimits().max_body_bytes
    _assert_error(*server.request("POST", "/answer", raw=body)[:2], 413, "larger than 1048576 bytes")


def test_a_huge_declared_length_is_413_before_any_body_is_read(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST /answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and json.loads(payload)["status"] == 413


def test_unknown_routes_and_methods_are_json(server):
    _assert_error(*server.get("/nope"), 404, "no route /nope")
    _assert_error(*server.get("/answer"), 405, "GET is not allowed on /answer")
    _assert_error(*server.post("/health", {}), 405, "POST is not allowed")


# ------------------------------------------------------------------------------ applications in this process

class _Held:
    """A real reader whose calls wait for ``release``: it keeps requests queued as long as a test needs."""

    def __init__(self, reader) -> None:
        self.reader, self.release, self.calls = reader, threading.Event(), 0

    def __getattr__(self, name):
        return getattr(self.reader, name)

    def answer_many(self, *args, **kwargs):
        self.calls += 1
        assert self.release.wait(60)
        return self.reader.answer_many(*args, **kwargs)


def test_one_model_only_a_full_queue_is_503_and_a_slow_answer_504(serve_models):
    from fastqa.tasks.qa import QAModel

    reader = _Held(QAModel.load(serve_models["qa"], device="cpu"))
    app = create_app(qa=reader, paths={"qa": "held"}, limits=ServeLimits(max_pending=2, max_body_bytes=100, max_batch=1,
                                                                   timeout_s=30))
    request = {"context": "Ada was born in Paris.", "question": "Where?"}
    with serve_in_thread(app) as client:
        status, body = client.get("/health")
        assert status == 200 and body["models"]["translation"] is None and body["models"]["qa"]["path"] == "held"
        _assert_error(*client.post("/translate", {"text": "ka"}), 503, "no translation model is loaded")
        _assert_error(*client.post("/answer", {"context": "x" * 100, "question": "y"}), 413, "larger than 100 bytes")
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(client.post, "/answer", request) for _ in range(2)]
            for _ in range(500):  # until both wait for the model
                if client.get("/health")[1]["queue"]["qa"] == 2:
                    break
                time.sleep(0.02)
            status, body, headers = client.request("POST", "/answer", request)
            _assert_error(status, body, 503, "2 requests waiting")
            assert headers["retry-after"] == "1"
            reader.release.set()
            assert [f.result(timeout=60)[0] for f in waiting] == [200, 200]
    reader.release.clear()
    app = create_app(qa=reader, limits=ServeLimits(timeout_s=0.3))
    with serve_in_thread(app) as client:
        _assert_error(*client.post("/answer", request), 504, r"did not answer within 0.3 s")
        reader.release.set()


# ------------------------------------------------------------------------------ the command's processes

def test_sigterm_finishes_the_requests_in_flight(serve_models, tmp_path):
    running = start_server(["--qa-model", str(serve_models["qa"]), "--max-batch", "1"], tmp_path / "server.log")
    pairs = _pairs(serve_models, 12)
    try:
        with ThreadPoolExecutor(len(pairs)) as pool:
            futures = [pool.submit(running.post, "/answer", {"context": c * 8, "question": q}) for c, q in pairs]
            for _ in range(1000):  # until most of them wait in the queue
                if running.get("/health")[1]["queue"]["qa"] >= len(pairs) // 2:
                    break
                time.sleep(0.01)
            running.process.send_signal(signal.SIGTERM)
            results = [f.result(timeout=120) for f in futures]
        assert [status for status, _ in results] == [200] * len(pairs), results
        # uvicorn re-raises the signal once it has shut down gracefully, as a process killed by it would end.
        assert running.process.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Traceback" not in running.log.read_text()
    finally:
        stop_server(running)


def test_several_worker_processes(serve_models, tmp_path):
    running = start_server(["--qa-model", str(serve_models["qa"]), "--workers", "2"], tmp_path / "server.log")
    try:
        pairs = _pairs(serve_models, 16)
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda p: running.post("/answer", {"context": p[0], "question": p[1]}), pairs))
        assert all(status == 200 for status, _ in results), results
        # Every worker's requests, added up by prometheus-client's multiprocess collector.
        text = running.request("GET", "/metrics")[1]
        assert _metric(text, "fastqa_requests_total") >= len(pairs)
    finally:
        stop_server(running)


def test_the_server_process_warms_up_then_freezes_what_it_loaded(serve_models, monkeypatch):
    """Each model answers once before the server listens (what loads on first use, the tokenizer, loads then),
    and what is loaded by then is left out of the collector's full passes (each walked all of it, pausing every
    request in flight)."""
    import gc

    from fastqa.data.tokenize import get_tokenizer
    from fastqa.serve.app import SETTINGS_ENV, app_from_environment

    monkeypatch.setenv(SETTINGS_ENV, json.dumps({"qa_model": str(serve_models["qa"]), "device": "cpu"}))
    get_tokenizer.cache_clear()
    gc.unfreeze()
    try:
        app_from_environment()
        assert get_tokenizer.cache_info().currsize > 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
