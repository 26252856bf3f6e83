"""Bad and hostile inputs of the QA commands, where a user meets them: every one is a clear error (exit
status 2, one ``fastqa: error:`` line naming the file or flag, no traceback) or a counted warning, never a
crash, a silent number or an allocation the size of a typo.

Covered: missing/unknown/int/duplicate question ids in ``qa-eval`` (``--strict``), blank contexts in
training, evaluation and prediction files, damaged ``.gz`` files, deeply nested JSON, a huge
``--max-answer-len``, non-UTF-8 ``--context``/``--question`` bytes, and an 8,000-character token in a
1,000-word context (the character window). All data is generated.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_user_error, run_cli
from helpers import SEED_ARGS
from squad_fixtures import make_squad, write_json

from fastqa.bounds import BOUNDS
from fastqa.data.files import read_json, read_text
from fastqa.errors import UserError
from fastqa.tasks.qa import QAModel, decode_top_spans
from fastqa.tasks.qa.squad import Limits, build_vocabs, encode_squad, encode_tokens, load_squad, read_squad

REPO = Path(__file__).resolve().parents[2]

# The smallest QANet that runs: these tests need a checkpoint to talk to, not a good reader.
TINY = ["--set", "d_model=16", "--set", "heads=2", "--set", "char_dim=8", "--set", "char_channels=16",
        "--set", "word_dim=16", "--set", "emb_conv_layers=1", "--set", "model_blocks=1", "--set", "dropout=0",
        "--set", "char_dropout=0", "--set", "layer_dropout=0"]


def _train_args(train, dev, out, *extra) -> list:
    return ["qa-train", "--train", train, "--dev", dev, "--out", out, "--no-cache", "--no-progress",
            "--batch-size", "4", "--threads", "1", "--eval-every", "0", *TINY, *SEED_ARGS, *extra]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny QANet checkpoint after two training steps."""
    from fastqa.cli import main

    root = tmp_path_factory.mktemp("inputs")
    make_squad(root / "train.json", articles=1, paragraphs=2, people=1, seed=21)
    assert main([str(a) for a in _train_args(root / "train.json", root / "train.json", root / "run",
                                             "--max-steps", "2")]) == 0
    return root / "run"


def _subprocess_cli(*args) -> subprocess.CompletedProcess:
    """``python -m fastqa.cli ARGS`` in a fresh process: the real stderr and exit status a user sees."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("FASTQA_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "fastqa.cli", *args], capture_output=True, env=env, timeout=300)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("fastqa: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _qids(obj: dict) -> list[str]:
    return [qa["id"] for a in obj["data"] for p in a["paragraphs"] for qa in p["qas"]]


def _gold(obj: dict) -> dict[str, str]:
    return {qa["id"]: qa["answers"][0]["text"] for a in obj["data"] for p in a["paragraphs"] for qa in p["qas"]}


# ----------------------------------------------------------------------------------- qa-eval: question ids

def test_qa_eval_warns_on_stderr_with_counts_of_missing_and_unknown_ids(tmp_path):
    obj = make_squad(tmp_path / "d.json", articles=1, paragraphs=3, people=1)
    preds = _gold(obj)
    qids = _qids(obj)
    for qid in qids[:5]:
        del preds[qid]
    preds.update({"not-in-data-1": "x", "not-in-data-2": "y"})
    (tmp_path / "p.json").write_text(json.dumps(preds), encoding="utf-8")
    proc = _subprocess_cli("qa-eval", tmp_path / "d.json", tmp_path / "p.json")
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert json.loads(proc.stdout)["exact_match"] == pytest.approx(100.0 * (len(qids) - 5) / len(qids))
    assert f"no prediction for 5 of {len(qids)} questions (e.g. {qids[0]!r}, {qids[1]!r}, {qids[2]!r}, ...)" in stderr
    assert "2 predictions are for question ids the data does not have (e.g. 'not-in-data-1', 'not-in-data-2')" in stderr
    assert len(stderr.strip().splitlines()) == 2, stderr      # a count each, not a line per id


def test_qa_eval_strict_refuses_missing_or_unknown_ids(tmp_path, capsys):
    obj = make_squad(tmp_path / "d.json", articles=1, paragraphs=2, people=1)
    preds = _gold(obj)
    pred = tmp_path / "p.json"
    pred.write_text(json.dumps(preds), encoding="utf-8")
    rc, out, _ = run_cli(capsys, ["qa-eval", tmp_path / "d.json", pred, "--strict"])
    assert rc == 0 and json.loads(out)["exact_match"] == 100.0
    missing = _qids(obj)[3]
    pred.write_text(json.dumps({k: v for k, v in preds.items() if k != missing}), encoding="utf-8")
    assert_user_error(capsys, ["qa-eval", tmp_path / "d.json", pred, "--strict"],
                      rf"p\.json: no prediction for 1 of 8 questions \(e\.g\. '{missing}'\)")
    pred.write_text(json.dumps({**preds, "extra": "x"}), encoding="utf-8")
    assert_user_error(capsys, ["qa-eval", tmp_path / "d.json", pred, "--strict"],
                      r"p\.json: 1 prediction is for question ids the data does not have \(e\.g\. 'extra'\)")


def test_int_ids_are_read_as_str_and_duplicate_ids_are_refused(tmp_path, capsys):
    obj = make_squad(articles=1, paragraphs=2, people=1)
    preds = {}
    for n, qa in enumerate(qa for a in obj["data"] for p in a["paragraphs"] for qa in p["qas"]):
        qa["id"] = 5000 + n                                   # int ids in the file
        preds[str(qa["id"])] = qa["answers"][0]["text"]        # JSON keys are strings
    data = write_json(tmp_path / "int.json", obj)
    assert all(isinstance(qa["id"], str) for a in read_squad(data)["data"] for p in a["paragraphs"] for qa in p["qas"])
    assert {q.qid for q in load_squad(data, progress=False).questions} == set(preds)
    (tmp_path / "p.json").write_text(json.dumps(preds), encoding="utf-8")
    rc, out, _ = run_cli(capsys, ["qa-eval", data, tmp_path / "p.json", "--strict"])
    assert rc == 0 and json.loads(out)["exact_match"] == 100.0
    # 5003 (an int) and "5003" (a str) are the same id
    obj["data"][0]["paragraphs"][1]["qas"][0]["id"] = "5003"
    dup = write_json(tmp_path / "dup.json", obj)
    pattern = r"dup\.json: question id '5003' appears twice \(article 0, paragraph 0 and article 0, paragraph 1\)"
    assert_user_error(capsys, ["qa-eval", dup, tmp_path / "p.json"], pattern)
    assert_user_error(capsys, _train_args(dup, dup, tmp_path / "o", "--max-steps", "1"), pattern)
    with pytest.raises(UserError, match=pattern):
        load_squad(dup, progress=False)


# --------------------------------------------------------------------------------------- blank contexts

def _with_blank_paragraphs(obj: dict) -> dict:
    """``obj`` plus two paragraphs whose context is empty / whitespace only; the second one's question has
    an answer that passes the offset check, so without the skip it would reach the model."""
    obj["data"][0]["paragraphs"].insert(1, {"context": "", "qas": [
        {"id": "blank-0", "question": "Who?", "answers": []}]})
    obj["data"][-1]["paragraphs"].append({"context": " \n\t\u00a0  ", "qas": [
        {"id": "blank-1", "question": "Where?", "answers": [{"text": "Oslo", "answer_start": 0}]}]})
    return obj


def test_blank_contexts_are_skipped_and_counted_everywhere(tmp_path, capsys, caplog):
    train = write_json(tmp_path / "train.json", _with_blank_paragraphs(make_squad(articles=1, paragraphs=2, people=1,
                                                                                   seed=5)))
    dev_obj = _with_blank_paragraphs(make_squad(articles=2, paragraphs=1, people=1, seed=6))
    dev = write_json(tmp_path / "dev.json", dev_obj)
    with caplog.at_level(logging.WARNING, logger="fastqa.data"):
        data = load_squad(dev, progress=False)
    assert "dev.json: skipped 2 paragraphs with an empty context and 2 questions on them (first: article 0, " \
           "paragraph 1)" in caplog.text
    assert data.skipped == [(0, 1), (1, 1)] and data.skipped_questions == ["blank-0", "blank-1"]
    assert len(data.contexts) == 2 and all(c.tokens for c in data.contexts)
    assert "blank-1" not in {q.qid for q in data.questions}
    # Training runs its steps and its evaluation, which never meets a blank context, and keeps both.
    out = tmp_path / "run"
    rc, stdout, _ = run_cli(capsys, _train_args(train, dev, out, "--max-steps", "3"))
    assert rc == 0 and {"EM", "F1"} <= set(json.loads(stdout.splitlines()[-1]))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [3] and (out / "checkpoint.pt").is_file()
    # Prediction skips them too, and qa-eval scores the same questions: nothing missing, nothing unknown.
    pred = tmp_path / "pred.json"
    rc, _, _ = run_cli(capsys, ["qa-predict", "--model", out, "--data", dev, "--out", pred, "--no-progress",
                                "--no-cache"])
    predictions = json.loads(pred.read_text(encoding="utf-8"))
    assert rc == 0 and set(predictions) == set(_qids(dev_obj)) - {"blank-0", "blank-1"}
    caplog.clear()
    rc, stdout, _ = run_cli(capsys, ["qa-eval", dev, pred, "--strict"])
    assert rc == 0 and "exact_match" in json.loads(stdout)
    # A file with nothing but blank contexts is refused, by every command that reads it.
    only_blank = write_json(tmp_path / "blank.json", {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "   ", "qas": [{"id": "b", "question": "Who?", "answers": []}]}]}]})
    pattern = r"blank\.json: every paragraph of articles 0:1 has an empty context"
    assert_user_error(capsys, ["qa-eval", only_blank, pred], pattern)
    assert_user_error(capsys, _train_args(only_blank, dev, tmp_path / "o2", "--max-steps", "1"), pattern)
    assert_user_error(capsys, _train_args(train, only_blank, tmp_path / "o3", "--max-steps", "1"), pattern)
    assert_user_error(capsys, ["qa-predict", "--model", out, "--data", only_blank, "--out", tmp_path / "x.json"],
                      pattern)


# ------------------------------------------------------------------------------ damaged and hostile files

def _damaged_gzips(tmp_path: Path) -> dict[str, Path]:
    """A truncated .gz (EOFError) and one with corrupt deflate data (zlib.error, which is not an OSError)."""
    text = json.dumps(make_squad(articles=2, paragraphs=3, people=2)).encode("utf-8")
    packed = gzip.compress(text)
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(packed[:len(packed) // 2])
    # flip bytes inside the deflate stream until zlib itself refuses it (deterministic for this input)
    for offset in range(20, len(packed) - 40):
        corrupt = packed[:offset] + bytes(b ^ 0x5A for b in packed[offset:offset + 16]) + packed[offset + 16:]
        try:
            gzip.decompress(corrupt)
        except zlib.error:
            break
        except (OSError, EOFError):
            continue
    else:
        raise AssertionError("no corruption of the test data raised zlib.error")
    bad = tmp_path / "corrupt.json.gz"
    bad.write_bytes(corrupt)
    return {"truncated": truncated, "corrupt": bad}


def test_damaged_gzip_files_are_one_line_errors(tmp_path, capsys, model_dir):
    good = write_json(tmp_path / "good.json", make_squad(articles=1, paragraphs=1, people=1))
    (tmp_path / "p.json").write_text("{}", encoding="utf-8")
    for kind, path in _damaged_gzips(tmp_path).items():
        pattern = rf"{path.name}: cannot read \(damaged gzip data"
        with pytest.raises(UserError, match=pattern):
            read_text(path)
        assert_user_error(capsys, ["qa-eval", path, tmp_path / "p.json"], pattern)
        assert_user_error(capsys, ["qa-eval", good, path], pattern + r".*\(predictions\)")
        assert_user_error(capsys, _train_args(path, good, tmp_path / f"o-{kind}", "--max-steps", "1"), pattern)
        assert_user_error(capsys, ["qa-predict", "--model", model_dir, "--data", path, "--out", tmp_path / "x.json",
                                   "--no-cache"], pattern)
        assert_user_error(capsys, ["ask", "--model", model_dir, "--context-file", path, "--question", "Who?"],
                          pattern + r".*\(--context-file\)")


def test_deeply_nested_json_is_a_one_line_error(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with pytest.raises(RecursionError):
        json.loads(deep.read_text(encoding="utf-8"))           # what the reader has to turn into an error
    with pytest.raises(UserError, match=r"deep\.json: the JSON is nested too deeply"):
        read_json(deep)
    good = write_json(tmp_path / "good.json", make_squad(articles=1, paragraphs=1, people=1))
    (tmp_path / "p.json").write_text("{}", encoding="utf-8")
    pattern = r"deep\.json: the JSON is nested too deeply to read"
    assert_user_error(capsys, ["qa-eval", deep, tmp_path / "p.json"], pattern)
    assert_user_error(capsys, ["qa-eval", good, deep], pattern + r" \(predictions\)")
    assert_user_error(capsys, ["qa-eval", good, tmp_path / "p.json", "--na-prob", deep],
                      pattern + r" \(no-answer probabilities\)")
    assert_user_error(capsys, _train_args(deep, good, tmp_path / "o", "--max-steps", "1"), pattern)
    deep_gz = tmp_path / "deep.json.gz"
    deep_gz.write_bytes(gzip.compress(deep.read_bytes()))
    assert_user_error(capsys, ["qa-eval", deep_gz, tmp_path / "p.json"], r"deep\.json\.gz: the JSON is nested too deeply")


# ------------------------------------------------------------------------------------------- ask arguments

def test_huge_max_answer_len_is_capped_at_the_context_length(model_dir, capsys):
    g = torch.Generator().manual_seed(0)
    lp1 = torch.log_softmax(torch.randn(3, 9, generator=g), 1)
    lp2 = torch.log_softmax(torch.randn(3, 9, generator=g), 1)
    whole = decode_top_spans(lp1, lp2, 2, max_answer_len=8)
    # Uncapped, 10**15 would ask for a [3, 9, 10**15] band: the result proves nothing of that size was made.
    for huge in (9, 10**8, 10**15):
        out = decode_top_spans(lp1, lp2, 2, max_answer_len=huge)
        assert all(torch.equal(out[k], whole[k]) for k in whole)
    out = decode_top_spans(torch.cat([lp1[:, :1], lp1], 1), torch.cat([lp2[:, :1], lp2], 1), 2,
                           max_answer_len=10**15, no_answer=True)
    assert out["start"].shape == (3, 2)
    context = "Ada Lovelace was born in Zürich in 1815. Later, Ada Lovelace played the cello every evening."
    args = ["ask", "--model", model_dir, "--context", context, "--question", "Who played the cello?"]
    rc, default, _ = run_cli(capsys, args)
    assert rc == 0
    # The declared bound (fastqa.bounds) lies past any window: the highest value allowed is capped, a larger one refused.
    high = BOUNDS["max_answer_len"].high
    rc, capped, _ = run_cli(capsys, [*args, "--max-answer-len", str(high)])
    assert rc == 0
    result = json.loads(capped)
    answer = result["answer"]
    assert context[answer["start"]:answer["end"]] == answer["text"] and result["answers"] == [answer]
    assert json.loads(default) == result                       # 30 tokens already span this context
    qa = QAModel.load(model_dir)
    assert qa.answer(context, "Who?", max_answer_len=high) == qa.answer(context, "Who?", max_answer_len=30)
    with pytest.raises(ValueError, match=r"^max_answer_len must be an int in \[0, \d+\] \(got 1000000000000000\)"):
        qa.answer(context, "Who?", max_answer_len=10**15)


def test_non_utf8_context_and_question_arguments(model_dir, capsys, tmp_path):
    # Non-UTF-8 bytes on a command line reach sys.argv as lone surrogates (PEP 383).
    bad = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")
    assert_user_error(capsys, ["ask", "--model", model_dir, "--context", bad, "--question", "What?"],
                      r"--context: not valid UTF-8 text \(an undecodable byte at character 3\)")
    assert_user_error(capsys, ["ask", "--model", model_dir, "--context", "Caf\u00e9 au lait.", "--question", bad],
                      r"--question: not valid UTF-8 text")
    with pytest.raises(ValueError, match=r"the context is not valid Unicode text \(a lone surrogate at character 3\)"):
        QAModel.load(model_dir).answer(bad, "What?")
    # ... and from a real shell: raw bytes in argv, the exit status and stderr the user sees
    proc = _subprocess_cli("ask", "--model", str(model_dir), "--context", b"caf\xe9 au lait", "--question", "What?")
    stderr = proc.stderr.decode("utf-8", "backslashreplace")
    assert proc.returncode == 2 and "--context: not valid UTF-8 text" in _one_error_line(stderr)
    assert proc.stdout == b""


# ---------------------------------------------------------------------------------- the character window

def _long_token_context() -> tuple[str, str]:
    blob = ("QUJD" * 2000)                                   # an 8,000-character base64-like token
    words = [f"word{i}" for i in range(999)]
    words[500] = blob
    return " ".join(words) + ".", blob


def test_a_huge_token_is_cut_to_the_character_window_in_every_path(model_dir, tmp_path, capsys, monkeypatch):
    context, blob = _long_token_context()
    assert len(blob) == 8000 and len(context.split()) == 999
    obj = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q", "question": "Which " + blob[:300] + " word?",
         "answers": [{"text": "word7", "answer_start": context.index("word7 ")}]}]}]}]}
    path = write_json(tmp_path / "long.json", obj)
    data = load_squad(path, progress=False)
    words, chars = build_vocabs(data)
    limits = Limits()
    for train in (True, False):
        enc = encode_squad(data, words, chars, train=train, limits=limits)
        assert enc.ctx_chars[0].shape[1] <= limits.chars and enc.q_chars[0].shape[1] <= limits.chars
    assert encode_tokens([blob], words, chars, 16)[1].shape == (1, 16)
    with pytest.raises(TypeError):
        encode_tokens([blob], words, chars)                   # no path can forget the window
    # The model's own window, through every entry of QAModel (answer, answer_many, probabilities, files) and
    # the commands built on it: record the char tensors' width at the model's door.
    widths: list[tuple[str, int]] = []
    load = QAModel.load.__func__

    def load_and_watch(cls, *args, **kwargs):
        qa = load(cls, *args, **kwargs)
        qa.model.register_forward_pre_hook(
            lambda m, inputs: widths.extend([(entry, inputs[1].shape[-1]), (entry, inputs[3].shape[-1])]))
        return qa

    monkeypatch.setattr(QAModel, "load", classmethod(load_and_watch))
    qa = QAModel.load(model_dir)
    window = qa.config.max_word_len
    assert qa.char_limit == window == limits.chars
    entry = "answer"
    res = qa.answer(context, "Which blob?")
    assert context[res.start:res.end] == res.text
    entry = "answer_many"
    qa.answer_many([context, "Short text."], [blob, "What?"])
    entry = "probabilities"
    qa.probabilities(context, blob)
    entry = "predict_file"
    qa.predict_file(path, progress=False)
    entry = "ask"
    rc, _, _ = run_cli(capsys, ["ask", "--model", model_dir, "--context", context, "--question", blob])
    assert rc == 0
    entry = "qa-predict"
    rc, _, _ = run_cli(capsys, ["qa-predict", "--model", model_dir, "--data", path, "--out", tmp_path / "p.json",
                                "--no-progress", "--no-cache"])
    assert rc == 0
    seen = {e for e, _ in widths}
    assert seen == {"answer", "answer_many", "probabilities", "predict_file", "ask", "qa-predict"}, widths
    assert max(w for _, w in widths) <= window, widths
