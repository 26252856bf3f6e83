"""A translator's confidence floor: fitted on a validation set by ``mt-eval --fit-confidence``, carried by the
run folder and its export, and ``translate`` warning (once) about the translations that score under it."""
import json
import random

import pytest
from cli_helpers import assert_user_error, run_cli

from fastqa.cli import main
from fastqa.errors import UserError
from fastqa.tasks.translation import Translator
from fastqa.tasks.translation.translator import ConfidenceFloor

MT_TINY = ["--set", "embed_dim=32", "--set", "hidden_dim=64", "--set", "encoder_layers=2", "--set", "decoder_layers=2",
           "--set", "dropout=0", "--set", "max_positions=32"]
WORDS = "ka lo mi nu po ri sa tu ve xo ya zu".split()


def test_fit_takes_the_quantile():
    floor = ConfidenceFloor.fit([-0.1 * i for i in range(100)], quantile=0.05, fitted_on="val", beam=5)
    assert floor.score == pytest.approx(-9.4) and ConfidenceFloor.from_dict(floor.to_dict()) == floor
    with pytest.raises(UserError, match="no sentence"):
        ConfidenceFloor.fit([], quantile=0.05, fitted_on="val", beam=5)


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt-confidence")
    rng = random.Random(7)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(200)]
    for name in ("train.de", "train.en"):
        (root / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main(["mt-train", "--src", str(root / "train.de"), "--tgt", str(root / "train.en"), "--valid-src",
                 str(root / "train.de"), "--valid-tgt", str(root / "train.en"), "--out", str(root / "run"), *MT_TINY,
                 "--vocab", "word", "--min-freq", "1", "--batch-size", "32", "--lr", "3e-3", "--no-progress",
                 "--threads", "1", "--max-steps", "20"]) == 0
    return root


def test_fit_confidence_then_translate_warns_once(mt_run, tmp_path, capsys):
    run = mt_run / "run"
    common = ["--model", str(run), "--threads", "1", "--device", "cpu", "--beam", "2"]
    rc, _, err = run_cli(capsys, ["mt-eval", *common, "--src", str(mt_run / "train.de"), "--ref",
                                  str(mt_run / "train.en"), "--fit-confidence", "0.9"])
    assert rc == 0 and "confidence floor" in err
    stored = json.loads((run / "confidence.json").read_text())
    assert stored["quantile"] == 0.9 and stored["beam"] == 2 and stored["fitted_on"] == "train.de"
    translator = Translator.load(run, device="cpu")
    assert translator.confidence_floor == ConfidenceFloor.from_dict(stored)
    # The export carries it.
    assert main(["export", str(run), str(tmp_path / "export")]) == 0
    capsys.readouterr()
    assert Translator.load(tmp_path / "export", device="cpu").confidence_floor == translator.confidence_floor
    # At the 0.9 quantile most of the training sentences score under the floor: one warning, then a count.
    source = tmp_path / "in.de"
    lines = (mt_run / "train.de").read_text().splitlines()[:20]
    source.write_text("\n".join(lines) + "\n")
    rc, out, err = run_cli(capsys, ["translate", *common, "--input", str(source)])
    scores = [t.score for t in translator.translate(lines, beam=2)]
    under = sum(s < stored["score"] for s in scores)
    assert rc == 0 and len(out.splitlines()) == 20 and under >= 2
    assert err.count("the model is unsure of this translation") == 1
    assert f"{under} of 20 translations scored under the confidence floor" in err


def test_fit_confidence_needs_a_model_folder(mt_run, capsys):
    assert_user_error(capsys, ["mt-eval", "--hyp", str(mt_run / "train.en"), "--ref", str(mt_run / "train.en"),
                               "--fit-confidence"], "leave out --fit-confidence")
    assert_user_error(capsys, ["mt-eval", "--model", str(mt_run / "run" / "checkpoint.pt"), "--src",
                               str(mt_run / "train.de"), "--ref", str(mt_run / "train.en"), "--threads", "1",
                               "--fit-confidence"], "writes into the model's folder")
