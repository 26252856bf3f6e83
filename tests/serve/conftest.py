"""Fixtures of the ``fastqa serve`` tests: two tiny models trained here on generated data, the real
command serving them from a subprocess on a free port of 127.0.0.1, and a headless Chromium.

The models are trained for a few steps only: the server's tests need models that load and answer, not
good answers (the task tests check learning). The fixtures are scoped to this folder: the models are trained
and the server started once for all the serve test files.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from typing import Any, Iterator

import pytest
from helpers import SEED_ARGS
from serve_helpers import Server, start_server, stop_server
from squad_fixtures import make_squad

from fastqa.cli import main

# The tiny QANet of tests/tasks/test_qa_pipeline.py and the tiny ConvS2S of tests/tasks/test_mt_toy.py.
QA_TINY = ["--set", "d_model=32", "--set", "heads=2", "--set", "char_dim=16", "--set", "char_channels=32",
           "--set", "word_dim=32", "--set", "emb_conv_layers=1", "--set", "model_blocks=1", "--set", "dropout=0",
           "--set", "char_dropout=0", "--set", "layer_dropout=0"]
MT_TINY = ["--set", "embed_dim=32", "--set", "hidden_dim=64", "--set", "encoder_layers=2",
           "--set", "decoder_layers=2", "--set", "dropout=0", "--set", "max_positions=32"]
WORDS = "ka lo mi nu po ri sa tu ve xo ya zu".split()


@pytest.fixture(scope="package")
def serve_models(tmp_path_factory) -> dict[str, Any]:
    """A QANet and a ConvS2S (word vocabulary) trained through ``fastqa qa-train`` / ``mt-train`` for a few
    steps; returns their run folders and the generated SQuAD object."""
    root = tmp_path_factory.mktemp("serve-models")
    squad = make_squad(root / "train.json", articles=1, paragraphs=4, people=2, seed=21)
    assert main(["qa-train", "--train", str(root / "train.json"), "--dev", str(root / "train.json"),
                 "--out", str(root / "qa"), "--cache-dir", str(root / "cache"), "--no-progress", "--lr", "3e-3",
                 "--warmup", "20", "--batch-size", "16", "--threads", "1", *QA_TINY, "--max-steps", "20",
                 "--eval-every", "0", *SEED_ARGS]) == 0
    rng = random.Random(3)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(300)]
    for name in ("train.de", "train.en"):
        (root / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main(["mt-train", "--src", str(root / "train.de"), "--tgt", str(root / "train.en"),
                 "--valid-src", str(root / "train.de"), "--valid-tgt", str(root / "train.en"),
                 "--out", str(root / "mt"), *MT_TINY, "--vocab", "word", "--min-freq", "1", "--batch-size", "32",
                 "--lr", "3e-3", "--no-progress", "--threads", "1", "--max-steps", "20", *SEED_ARGS]) == 0
    return {"root": root, "qa": root / "qa", "mt": root / "mt", "squad": squad}


@pytest.fixture(scope="package")
def server(serve_models, tmp_path_factory) -> Iterator[Server]:
    """``fastqa serve --qa-model QA --mt-model MT`` on 127.0.0.1, a free port."""
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    running = start_server(["--qa-model", str(serve_models["qa"]), "--mt-model", str(serve_models["mt"])], log)
    yield running
    stop_server(running)


def _install_chromium() -> str | None:
    """``apt-get install -y chromium`` (after ``apt-get update`` if the package is unknown); None or why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "Chromium is not installed and the tests do not run as root (apt-get install -y chromium)"
    if shutil.which("apt-get") is None:
        return "Chromium is not installed and there is no apt-get here to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    attempts = [["apt-get", "install", "-y", "chromium"], ["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]]
    result = None
    for cmd in attempts:
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} did not finish in 15 minutes"
        if cmd[1] == "install" and result.returncode == 0:
            return None
    tail = (result.stderr or result.stdout).strip().splitlines()[-1:] if result is not None else []
    return f"apt-get install -y chromium failed ({tail[0] if tail else 'no output'})"


@pytest.fixture(scope="package")
def chromium() -> str:
    """The path of a headless-capable Chromium: /usr/bin/chromium, else installed with apt-get when the tests run
    as root; skips with the reason otherwise."""
    def find() -> str | None:
        for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
            if candidate and os.access(candidate, os.X_OK):
                return candidate
        return None

    path = find()
    if path is None:
        why = _install_chromium()
        path = find()
        if path is None:
            pytest.skip(why or "apt-get installed chromium but no chromium binary is on PATH")
    return path
