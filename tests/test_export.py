"""Slim exports (``fastqa export``, ``fastqa.export``): a run folder of any task becomes safetensors weights, a
config.json and a model card; loading one gives the payload a checkpoint gives, so a model answers the same
from either; float16 halves the size; bytes in the meta (a SentencePiece model) travel as side files; and
every damaged, missing or incomplete file is one error naming it."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from cli_helpers import assert_user_error, run_cli
from helpers import SEED_ARGS
from squad_fixtures import make_squad

from fastqa.errors import UserError
from fastqa.export import CONFIG_NAME, WEIGHTS_NAME, export_run, load_export, load_model_payload
from fastqa.train.checkpoint import inference_weights, load_checkpoint, save_checkpoint

pytest.importorskip("safetensors")

TINY = ["--set", "d_model=16", "--set", "heads=2", "--set", "char_dim=8", "--set", "char_channels=16",
        "--set", "word_dim=16", "--set", "emb_conv_layers=1", "--set", "model_blocks=1", "--set", "dropout=0",
        "--set", "char_dropout=0", "--set", "layer_dropout=0"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """A tiny QANet run (40 steps on generated questions, EMA kept) and its data."""
    from fastqa.cli import main

    root = tmp_path_factory.mktemp("export")
    obj = make_squad(root / "train.json", articles=1, paragraphs=3, people=2, seed=7)
    args = ["qa-train", "--train", root / "train.json", "--dev", root / "train.json", "--out", root / "run",
            "--no-cache", "--no-progress", "--batch-size", "8", "--threads", "1", "--lr", "3e-3", "--warmup", "10",
            "--max-steps", "40", *TINY, *SEED_ARGS]
    assert main([str(a) for a in args]) == 0
    paragraphs = [p for a in obj["data"] for p in a["paragraphs"]]
    return {"root": root, "run": root / "run", "contexts": [p["context"] for p in paragraphs for _ in p["qas"]],
            "questions": [q["question"] for p in paragraphs for q in p["qas"]]}


def _answers(path, run: dict) -> list[list]:
    """The 3 best ``Answer``s of every question of the run's data, read by the model in ``path``."""
    from fastqa.tasks.qa import QAModel

    return QAModel.load(path, device="cpu").answer_many(run["contexts"], run["questions"], top_k=3)


def test_float32_export_answers_exactly_as_the_run(run, tmp_path, capsys):
    out = tmp_path / "fp32"
    rc, stdout, _ = run_cli(capsys, ["export", run["run"], out])
    assert rc == 0 and json.loads(stdout)["files"] == ["README.md", CONFIG_NAME, WEIGHTS_NAME]
    payload, ckpt = load_export(out), load_checkpoint(run["run"])
    assert payload["kind"] == ckpt["kind"] == "qanet"
    assert payload["meta"] == json.loads(json.dumps(ckpt["meta"]))       # everything of the meta, as JSON
    ema = inference_weights(ckpt)
    assert ckpt["ema"] is not None and set(payload["model"]) == set(ema)
    assert all(torch.equal(payload["model"][k], ema[k]) for k in ema)    # the EMA weights, bit for bit
    assert inference_weights(payload) is payload["model"]
    assert _answers(out, run) == _answers(run["run"], run)
    config = json.loads((out / CONFIG_NAME).read_text(encoding="utf-8"))
    assert config["weights"]["source"] == "ema" and config["weights"]["dtype"] == "float32"
    assert config["source"]["run"] == str(run["run"]) and config["source"]["step"] == 40
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "qanet" in card and str(run["run"]) in card and f"{config['weights']['parameters']:,}" in card
    assert "last evaluation" in card and "EM" in card
    # every way in reads the same model: the folder, its config.json, the run, its checkpoint
    for path in (out, out / CONFIG_NAME, run["run"], run["run"] / "checkpoint.pt"):
        assert load_model_payload(path)[0]["kind"] == "qanet"


def test_half_export_is_smaller_and_answers_close(run, tmp_path, capsys):
    full, half = tmp_path / "fp32", tmp_path / "fp16"
    export_run(run["run"], full)
    rc, _, _ = run_cli(capsys, ["export", run["run"], half, "--half"])
    assert rc == 0
    assert (half / WEIGHTS_NAME).stat().st_size < 0.6 * (full / WEIGHTS_NAME).stat().st_size
    payload = load_export(half)
    assert all(t.dtype == torch.float32 for t in payload["model"].values() if t.is_floating_point())
    ref = load_export(full)["model"]
    assert all(torch.allclose(payload["model"][k], ref[k], rtol=1e-3, atol=1e-4) for k in ref)
    got, want = _answers(half, run), _answers(run["run"], run)
    assert all(1 <= len(a) <= 3 for a in got + want)
    agree = sum(g[0].text == w[0].text for g, w in zip(got, want))
    assert agree >= len(want) - 1                    # rounding may flip a near-tie of an undertrained reader
    assert [g[0].score for g in got] == pytest.approx([w[0].score for w in want], abs=2e-2)
    assert json.loads((half / CONFIG_NAME).read_text())["weights"]["dtype"] == "float16"


def test_bytes_in_the_meta_travel_as_side_files(tmp_path):
    # A model-agnostic run: what a translation run's checkpoint holds (a SentencePiece model as bytes).
    spm = bytes(range(256)) * 40
    meta = {"config": {"d_model": 8, "layers_enc": (2, 3)}, "src_vocab": {"itos": ["<pad>", "<unk>", "a"]},
            "text": {"src_lang": "de", "lowercase": False}, "vocab": {"kind": "subword", "sentencepiece": spm},
            "extra": [b"\x00raw", {"x": None, "y": 1.5}]}
    weights = {"proj.weight": torch.randn(4, 3), "proj.bias": torch.randn(4), "steps": torch.tensor([3])}
    weights["tied.weight"] = weights["proj.weight"]          # tied weights share memory: stored twice
    save_checkpoint(tmp_path / "mt", {"kind": "convs2s", "meta": meta, "model": weights, "ema": None, "step": 9})
    out = export_run(tmp_path / "mt", tmp_path / "mt-export")
    assert (out / "subword.model").read_bytes() == spm
    config = json.loads((out / CONFIG_NAME).read_text())
    assert config["meta"]["vocab"]["sentencepiece"] == {"$bytes": "subword.model"}
    assert config["weights"]["source"] == "model"
    payload = load_export(out)
    assert payload["kind"] == "convs2s" and payload["step"] == 9
    assert payload["meta"] == {**meta, "config": {"d_model": 8, "layers_enc": [2, 3]}}   # tuples come back as lists
    assert all(torch.equal(payload["model"][k], weights[k]) for k in weights)
    assert payload["model"]["steps"].dtype == torch.int64
    # a side file that goes missing or changes is named
    (out / "subword.model").write_bytes(spm[:-1] + b"x")
    with pytest.raises(UserError, match=r"subword\.model: damaged export: checksum mismatch"):
        load_export(out)
    (out / "subword.model").unlink()
    with pytest.raises(UserError, match=r"subword\.model: missing from the export"):
        load_export(out)
    # re-exporting over an export replaces it, leaving no stale side file
    save_checkpoint(tmp_path / "plain", {"kind": "convs2s", "meta": {"config": {}}, "model": weights, "ema": None})
    export_run(tmp_path / "plain", out, half=True)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]
    assert load_export(out)["model"]["steps"].dtype == torch.int64


def test_damaged_exports_are_one_line_errors_naming_the_file(run, tmp_path, capsys):
    good = export_run(run["run"], tmp_path / "good")

    def broken(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(good, folder)
        return folder

    flipped = broken("flipped")
    data = bytearray((flipped / WEIGHTS_NAME).read_bytes())
    data[len(data) // 2] ^= 0x01
    (flipped / WEIGHTS_NAME).write_bytes(bytes(data))
    cut = broken("cut")
    (cut / WEIGHTS_NAME).write_bytes((good / WEIGHTS_NAME).read_bytes()[:-100])
    gone = broken("gone")
    (gone / WEIGHTS_NAME).unlink()
    malformed = broken("malformed")
    (malformed / CONFIG_NAME).write_text('{"format": "fastqa-export-1",\n "kind": }', encoding="utf-8")
    incomplete = broken("incomplete")
    config = json.loads((incomplete / CONFIG_NAME).read_text())
    del config["files"]
    (incomplete / CONFIG_NAME).write_text(json.dumps(config))
    cases = [(flipped, r"flipped/model\.safetensors: damaged export: checksum mismatch"),
             (cut, r"cut/model\.safetensors: damaged export: \d+ bytes where \d+ were written"),
             (gone, r"gone/model\.safetensors: missing from the export"),
             (malformed, r"malformed/config\.json: malformed JSON at line 2"),
             (incomplete, r"incomplete/config\.json: missing or invalid 'files'")]
    for folder, message in cases:
        with pytest.raises(UserError, match=message):
            load_export(folder)
        assert_user_error(capsys, ["ask", "--model", folder, "--context", "Some text.", "--question", "What?"], message)
    # not an export at all, a wrong kind
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty/config\.json: no such file \(not a fastqa export"):
        load_export(tmp_path / "empty")
    other = broken("other")
    config = json.loads((other / CONFIG_NAME).read_text())
    (other / CONFIG_NAME).write_text(json.dumps({**config, "kind": "convs2s"}))
    assert_user_error(capsys, ["ask", "--model", other, "--context", "Text.", "--question", "Q?"],
                      r"other/config\.json: a 'convs2s' checkpoint, not a reader's")


def test_export_refuses_what_it_cannot_write(run, tmp_path, capsys):
    assert_user_error(capsys, ["export", tmp_path / "norun", tmp_path / "out"],
                      r"norun(/checkpoint\.pt)?: no such checkpoint")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert_user_error(capsys, ["export", run["run"], busy], r"busy: exists and is not an export")
    assert (busy / "notes.txt").read_text() == "mine"
    assert_user_error(capsys, ["export", run["run"], run["run"]], r"is the folder being exported")
    save_checkpoint(tmp_path / "odd", {"kind": "x", "meta": {"when": object()}, "model": {}, "ema": None})
    with pytest.raises(UserError, match=r"meta holds a object at when"):
        export_run(tmp_path / "odd", tmp_path / "odd-out")
    save_checkpoint(tmp_path / "keys", {"kind": "x", "meta": {"ids": {1: "a"}}, "model": {}, "ema": None})
    with pytest.raises(UserError, match=r"key 1 of type int at ids"):
        export_run(tmp_path / "keys", tmp_path / "keys-out")
    # an export of an export: the weights and meta as they were
    first = export_run(run["run"], tmp_path / "first")
    again = export_run(first, tmp_path / "again", half=True)
    assert load_export(again)["meta"] == load_export(first)["meta"]


def test_export_help_does_not_import_torch():
    import subprocess

    code = ("import sys; from fastqa.cli import build_parser; p = build_parser(); "
            "p.parse_args(['export', 'a', 'b', '--half']); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


def test_a_file_fitted_after_training_travels_in_the_meta(run, tmp_path, capsys):
    # ``META_FILES``: a calibration.json beside the weights (qa-calibrate) is read into the meta, wins over the
    # meta's own value, and an export of the folder carries it in its config.json.
    from fastqa.export import META_FILES

    assert META_FILES["calibration"] == "calibration.json"
    folder = tmp_path / "run"
    shutil.copytree(run["run"], folder)
    assert "calibration" not in load_model_payload(folder)[0]["meta"]
    cal = {"slope": 0.5, "bias": -0.25, "fitted_on": "dev.json", "questions": 10, "method": "platt"}
    (folder / "calibration.json").write_text(json.dumps(cal), encoding="utf-8")
    for path in (folder, folder / "checkpoint.pt"):
        assert load_model_payload(path)[0]["meta"]["calibration"] == cal
    out = export_run(folder, tmp_path / "export")
    assert json.loads((out / CONFIG_NAME).read_text(encoding="utf-8"))["meta"]["calibration"] == cal
    assert load_export(out)["meta"]["calibration"] == cal and not (out / "calibration.json").exists()
    newer = {**cal, "slope": 2.0}
    (out / "calibration.json").write_text(json.dumps(newer), encoding="utf-8")    # fitted on the export: it wins
    assert load_model_payload(out)[0]["meta"]["calibration"] == newer
    (folder / "calibration.json").write_text('{"slope": 1,\n "bias": }', encoding="utf-8")
    assert_user_error(capsys, ["ask", "--model", folder, "--context", "Some text.", "--question", "What?"],
                      r"calibration\.json: malformed JSON at line 2")
    (folder / "calibration.json").write_text(json.dumps({**cal, "slope": -1.0}), encoding="utf-8")
    assert_user_error(capsys, ["ask", "--model", folder, "--context", "Some text.", "--question", "What?"],
                      r"calibration.* slope must be a positive number")
