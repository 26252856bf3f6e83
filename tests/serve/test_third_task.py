"""A task is one spec: a third task registered from tests/ (``toy_third_task``) trains, exports and answers
through the command line and through ``fastqa serve`` with no line of the package changed."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli
from serve_helpers import Client

import toy_third_task
from fastqa import tasks

HERE = Path(__file__).resolve().parents[1]  # tests/, where toy_third_task.py is


@pytest.fixture
def registered():
    before = list(tasks.TASKS)
    tasks.add_task(toy_third_task.SPEC)
    yield tasks.TASKS
    tasks.TASKS[:] = before  # the registration ends with the test (the list is the one every module reads)


def test_adding_a_task_twice_or_a_taken_kind_is_refused(registered):
    with pytest.raises(ValueError, match="a task named 'toy' is registered already"):
        tasks.add_task(toy_third_task.SPEC)
    assert tasks.task_of("no-such-model", "toy") == "toy"


def test_a_third_task_trains_exports_answers_and_is_served(registered, capsys, caplog, tmp_path):
    run, export = tmp_path / "run", tmp_path / "export"
    with caplog.at_level(logging.INFO, logger="fastqa"):
        rc, _, err = run_cli(capsys, ["toy-train", "--out", str(run), "--steps", "5"])
    assert rc == 0 and (run / "checkpoint.pt").is_file(), err
    # The trainer's expectation line quotes the documented run of the task's own spec.
    assert any(m.startswith("toy-train: tiny preset") and "reaches a toy loss after 5 steps" in m
               for m in caplog.messages), caplog.messages
    rc, out, err = run_cli(capsys, ["export", str(run), str(export)])
    assert rc == 0 and (export / "model.safetensors").is_file(), err
    x = [0.1, -0.2, 0.3, 0.0, 0.5, -1.0]
    rc, out, err = run_cli(capsys, ["toy-predict", "--model", str(export), "--x", ",".join(map(str, x))])
    assert rc == 0, err
    y = json.loads(out)["y"]
    assert y == pytest.approx(toy_third_task.ToyRegressor.load(run, device="cpu").predict([x])[0], abs=1e-6)
    # fastqa serve, in a process of its own where the toy task is registered: its flag, route and /health.
    log = open(tmp_path / "serve.log", "w")
    process = subprocess.Popen([sys.executable, str(HERE / "toy_third_task.py"), "serve", "--toy-model", str(export),
                                "--port", "0", "--device", "cpu", "--threads", "1", "--log-level", "warning"],
                               cwd=HERE, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("fastqa serve: toy on http://"), (tmp_path / "serve.log").read_text()
        client = Client(first.split()[-1])
        status, body = client.post("/toy", {"x": x})
        assert status == 200 and body["y"] == pytest.approx(y, abs=1e-5)
        status, health = client.get("/health")
        assert status == 200 and health["models"]["toy"]["path"] == str(export) and health["models"]["qa"] is None
        status, body = client.post("/answer", {"context": "a b", "question": "a?"})
        assert status == 503 and "--qa-model DIR" in body["error"]
        status, body = client.post("/toy", {"x": [1.0]})
        assert status == 422 and body["field"] == "x"
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
    # With worker processes (which start with the built-in tasks only) the toy task is served as well.
    log = open(tmp_path / "serve-workers.log", "w")
    process = subprocess.Popen([sys.executable, str(HERE / "toy_third_task.py"), "serve", "--toy-model", str(export),
                                "--port", "0", "--device", "cpu", "--threads", "1", "--workers", "2",
                                "--log-level", "warning"], cwd=HERE, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("fastqa serve: toy (2 worker processes) on http://"), \
            (tmp_path / "serve-workers.log").read_text()
        client = Client(first.split()[-1])
        for _ in range(4):   # whichever worker takes the request
            status, body = client.post("/toy", {"x": x})
            assert status == 200 and body["y"] == pytest.approx(y, abs=1e-5), body
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
