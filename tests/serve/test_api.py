"""The HTTP API of ``fastqa serve`` over real HTTP: the command serving two tiny models from a subprocess
(/health, /answer, /translate, concurrent requests, every kind of bad request), and applications served from
a thread of the test process for what needs its own set-up (one model only, a full queue)."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_helpers import serve_in_thread

from fastqa.serve.app import create_app
from fastqa.serve.engines import QAEngine
from fastqa.serve.limits import ServeLimits


def _paragraphs(serve_models) -> list[dict]:
    return [p for article in serve_models["squad"]["data"] for p in article["paragraphs"]]


def _assert_error(status: int, body, want_status: int, pattern: str, field: str | None = None) -> None:
    """A JSON error: {"error": a message matching pattern, "status": want_status[, "field"]}."""
    assert status == want_status, (status, body)
    assert isinstance(body, dict) and body["status"] == want_status, body
    assert re.search(pattern, body["error"]), body["error"]
    if field is not None:
        assert body.get("field") == field, body


# ------------------------------------------------------------------------------------------ the routes

def test_health_names_the_loaded_models(server, serve_models):
    status, body = server.get("/health")
    assert status == 200 and body["status"] == "ok"
    assert body["models"]["qa"]["path"] == str(serve_models["qa"]) and body["models"]["qa"]["model"] == "QANet"
    assert body["models"]["translation"]["path"] == str(serve_models["mt"])
    assert body["models"]["translation"]["vocab"] == "word"
    assert body["limits"] == ServeLimits().to_dict()


def test_answer_is_a_slice_of_the_context(server, serve_models):
    para = _paragraphs(serve_models)[0]
    question = para["qas"][0]["question"]
    status, body = server.post("/answer", {"context": para["context"], "question": question})
    assert status == 200, body
    best = body["answer"]
    assert {"text", "score", "start", "end"} <= set(best) and 0 < best["score"] <= 1
    assert para["context"][best["start"]:best["end"]] == best["text"] != ""
    assert body["top_k"] == [best]


def test_answer_matches_the_python_api_and_gives_top_k(server, serve_models):
    from fastqa.tasks.qa import QAModel

    qa = QAModel.load(serve_models["qa"], device="cpu")
    para = _paragraphs(serve_models)[1]
    for item in para["qas"][:3]:
        status, body = server.post("/answer", {"context": para["context"], "question": item["question"], "top_k": 5})
        assert status == 200, body
        want = qa.answer(para["context"], item["question"])
        assert (body["answer"]["text"], body["answer"]["start"]) == (want["text"], want["start"])
        assert body["answer"]["score"] == pytest.approx(want["score"], rel=1e-4)  # float32 either way
        spans = body["top_k"]
        assert len(spans) == 5 and len({(s["start"], s["end"]) for s in spans}) == 5
        assert [s["score"] for s in spans] == sorted((s["score"] for s in spans), reverse=True)
        assert all(para["context"][s["start"]:s["end"]] == s["text"] for s in spans)
        assert (spans[0]["start"], spans[0]["end"]) == (want["start"], want["end"])
    # max_answer_len 0: one-token answers only
    status, body = server.post("/answer", {"context": para["context"], "question": para["qas"][0]["question"],
                                           "top_k": 3, "max_answer_len": 0})
    assert status == 200 and all(" " not in s["text"].strip() for s in body["top_k"])


def test_translate_text_sentences_and_attention(server, serve_models):
    from fastqa.tasks.translation import Translator

    tr = Translator.load(serve_models["mt"])
    status, body = server.post("/translate", {"text": "ka lo mi nu"})
    assert status == 200, body
    (row,) = body["translations"]
    assert row == {"source": "ka lo mi nu", "text": tr.translate(["ka lo mi nu"], beam=5)[0]}
    sentences = ["ka lo mi", "", "nu po ri sa tu"]
    status, body = server.post("/translate", {"sentences": sentences, "beam": 2, "attention": True})
    assert status == 200, body
    rows = body["translations"]
    assert [r["source"] for r in rows] == sentences
    assert [r["text"] for r in rows] == tr.translate(sentences, beam=2)
    assert rows[1]["text"] == "" and rows[1]["attention"] is None
    for r in (rows[0], rows[2]):
        amap = r["attention"]
        assert amap["source"] == [*r["source"].split(), "<eos>"] and amap["target"][-1] == "<eos>"
        assert len(amap["weights"]) == len(amap["target"])
        assert all(len(w) == len(amap["source"]) and sum(w) == pytest.approx(1, abs=1e-3) for w in amap["weights"])
        assert " ".join(amap["target"][:-1]) == r["text"]


def test_translate_nbest_when_the_translator_gives_it(server):
    nbest = server.get("/health")[1]["models"]["translation"]["nbest"]
    status, body = server.post("/translate", {"text": "ka lo mi", "beam": 3, "nbest": 2})
    if not nbest:
        _assert_error(status, body, 422, "nbest")
        return
    assert status == 200, body
    (row,) = body["translations"]
    assert 1 <= len(row["nbest"]) <= 2 and row["nbest"][0]["text"] == row["text"]
    assert [h["score"] for h in row["nbest"]] == sorted((h["score"] for h in row["nbest"]), reverse=True)


def test_the_page_is_one_offline_file(server):
    status, page, headers = server.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "<script>" in page and "<style>" in page
    assert "http://" not in page and "https://" not in page and "src=" not in page  # nothing from elsewhere


# ------------------------------------------------------------------------------------------ concurrency

def test_concurrent_requests_all_succeed_with_the_answers_of_one_at_a_time(server, serve_models):
    pairs = [(p["context"], q["question"]) for p in _paragraphs(serve_models) for q in p["qas"]][:24]
    one_at_a_time = [server.post("/answer", {"context": c, "question": q}) for c, q in pairs]
    assert all(status == 200 for status, _ in one_at_a_time)
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
    for (context, _), (status, body), (_, alone) in zip(pairs, results, one_at_a_time):
        assert status == 200, body
        assert context[body["answer"]["start"]:body["answer"]["end"]] == body["answer"]["text"]
        assert body["answer"]["text"] == alone["answer"]["text"]  # concurrency changes nothing


# ------------------------------------------------------------------------------------------ bad requests

@pytest.mark.parametrize("raw,status,pattern", [
    (b'{"context": "a b", "question": ', 400, "malformed JSON"),
    (b"", 400, "empty"),
    (b"\xff\xfe{}", 400, "not UTF-8"),
    (b"[1, 2]", 422, "expected a JSON object, got a JSON array"),
    (b'"just text"', 422, "got a JSON string"),
])
def test_malformed_bodies(server, raw, status, pattern):
    got, body, headers = server.request("POST", "/answer", raw=raw)
    _assert_error(got, body, status, pattern)
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("payload,pattern,field", [
    ({"context": "Ada was born in Kraków."}, "missing field 'question'", "question"),
    ({"question": "Where?"}, "missing field 'context'", "context"),
    ({"context": "Ada was born in Kraków.", "question": 3}, "question: expected a string, got a JSON number", "question"),
    ({"context": ["Ada"], "question": "Where?"}, "context: expected a string, got a JSON array", "context"),
    ({"context": "Ada was born.", "question": "   "}, "question: the text is empty", "question"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": "5"}, "top_k: expected an integer", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": 2.5}, "top_k: expected an integer", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": True}, "top_k: expected an integer", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": 0}, "top_k: 0 is out of range", "top_k"),
    ({"context": "Ada was born.", "question": "Who?", "top_k": 21}, "top_k: 21 is out of range", "top_k"),
    ({"context": "Ada was born.", "questoin": "Who?"}, "unknown field 'questoin'", "questoin"),
    ({"context": "x " * 10_001, "question": "Who?"}, "context: 20002 characters, more than the server's limit", "context"),
])
def test_bad_answer_requests_are_422_naming_the_field(server, payload, pattern, field):
    _assert_error(*server.post("/answer", payload), 422, pattern, field)


@pytest.mark.parametrize("payload,pattern", [
    ({}, "either 'text'"),
    ({"text": "ka", "sentences": ["ka"]}, "either 'text'"),
    ({"sentences": "ka lo"}, "sentences: expected an array of strings, got a JSON string"),
    ({"sentences": []}, "sentences: the list is empty"),
    ({"sentences": ["ka", 7]}, r"sentences\[1\]: expected a string"),
    ({"sentences": ["ka"] * 65}, "65 sentences, more than the server's limit of 64"),
    ({"text": "ka", "beam": 0}, "beam: 0 is out of range"),
    ({"text": "ka", "beam": 17}, "beam: 17 is out of range"),
    ({"text": "ka", "beam": 2, "nbest": 3}, "nbest: 3 is out of range"),
    ({"text": "ka", "attention": "yes"}, "attention: expected true or false"),
    ({"text": "ka " * 1000}, "text: 3000 characters"),
])
def test_bad_translate_requests_are_422(server, payload, pattern):
    _assert_error(*server.post("/translate", payload), 422, pattern)


def test_text_the_model_cannot_read_is_422(server):
    # A lone surrogate is valid JSON (an escape) but not text; the reader refuses it and says why.
    raw = b'{"context": "Ada was born in \\ud800 Krak\\u00f3w.", "question": "Where?"}'
    _assert_error(*server.request("POST", "/answer", raw=raw)[:2], 422, "not valid Unicode")


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

class _SlowReader:
    """A reader whose answer waits for a signal: it keeps requests queued as long as a test needs."""

    max_answer_len = 30

    def __init__(self) -> None:
        self.release = threading.Event()

    def answer(self, context, question, *, max_answer_len=None):
        assert self.release.wait(60)
        return {"text": context[:1], "score": 1.0, "start": 0, "end": 1}

    def probabilities(self, context, question):  # pragma: no cover - top_k 1 only here
        raise AssertionError("not used")


def test_one_model_only_and_a_full_queue_is_503():
    reader = _SlowReader()
    engine = QAEngine(reader, path="slow")
    app = create_app(qa=engine, limits=ServeLimits(max_pending=2, max_body_bytes=100))
    with serve_in_thread(app) as client:
        status, body = client.get("/health")
        assert status == 200 and body["models"]["translation"] is None and body["models"]["qa"]["path"] == "slow"
        _assert_error(*client.post("/translate", {"text": "ka"}), 503, "no translation model is loaded")
        _assert_error(*client.post("/answer", {"context": "x" * 100, "question": "y"}), 413, "larger than 100 bytes")
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(client.post, "/answer", {"context": "ab", "question": "q"}) for _ in range(2)]
            for _ in range(500):  # until both wait for the model
                if engine.pending == 2:
                    break
                time.sleep(0.02)
            status, body, headers = client.request("POST", "/answer", {"context": "ab", "question": "q"})
            _assert_error(status, body, 503, "2 requests waiting")
            assert headers["retry-after"] == "1"
            reader.release.set()
            assert [f.result(timeout=60)[0] for f in waiting] == [200, 200]
