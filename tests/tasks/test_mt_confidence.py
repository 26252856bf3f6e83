"""A translator's confidence floor: fitted on a validation set by ``mt-eval --fit-confidence``, carried by the
run folder and its export; ``Translation.unsure`` where a translation is past it (its log-probability per token
under the floor's score, or its next-token entropy over the floor's), in the API, ``translate --json`` and the
server's ``/translate``, and ``translate`` naming every unsure line on stderr."""
import io
import json
import random
import re

import pytest
from cli_helpers import assert_user_error, run_cli
from helpers import SEED_ARGS

from fastqa.cli import main
from fastqa.errors import UserError
from fastqa.tasks.translation import Translator
from fastqa.tasks.translation.translator import ConfidenceFloor, Translation

MT_TINY = ["--set", "embed_dim=32", "--set", "hidden_dim=64", "--set", "encoder_layers=2", "--set", "decoder_layers=2",
           "--set", "dropout=0", "--set", "max_positions=32"]
WORDS = "ka lo mi nu po ri sa tu ve xo ya zu".split()


def test_fit_takes_the_quantile():
    floor = ConfidenceFloor.fit([-0.1 * i for i in range(100)], quantile=0.05, fitted_on="val", beam=5)
    assert floor.score == pytest.approx(-9.4) and floor.entropy is None
    assert ConfidenceFloor.from_dict(floor.to_dict()) == floor
    with pytest.raises(UserError, match="no sentence"):
        ConfidenceFloor.fit([], quantile=0.05, fitted_on="val", beam=5)
    # the entropy's floor is the other tail: all but 5% of the sentences are under it
    floor = ConfidenceFloor.fit([-0.1 * i for i in range(100)], quantile=0.05, fitted_on="val", beam=5,
                                entropies=[0.1 * i for i in range(100)])
    assert floor.entropy == pytest.approx(9.5) and ConfidenceFloor.from_dict(floor.to_dict()) == floor
    # a floor written before entropies were fitted still loads: the score alone decides
    assert ConfidenceFloor.from_dict({"score": -1.0, "quantile": 0.05, "beam": 5}).entropy is None


def _translation(tokens: int, log_prob: float, entropy: float | None = None) -> Translation:
    return Translation(text="x", tokens=["x"] * tokens, score=log_prob / (tokens + 1) ** 2, log_prob=log_prob,
                       entropy=entropy)


def test_the_rule_compares_the_log_probability_per_token_and_the_entropy():
    floor = ConfidenceFloor(score=-1.0, quantile=0.05, fitted_on="val", beam=5, entropy=2.0)
    # per token, whatever length penalty made ``score``: -3.6 over 4 steps is -0.9 (score -0.144 here)
    assert not floor.unsure(_translation(3, -3.6, 1.0))
    assert floor.unsure(_translation(3, -4.4, 1.0))                       # -1.1 per token
    assert floor.unsure(_translation(3, -3.6, 2.5))                       # likely enough, but the entropy is high
    assert not floor.unsure(_translation(3, -3.6, None))                  # no entropy measured: the score decides
    assert not floor.unsure(Translation(text="", tokens=[], score=0.0, log_prob=0.0))   # an empty line
    assert _translation(3, -3.6).to_dict()["unsure"] is False


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
                 "--threads", "1", "--max-steps", "20", *SEED_ARGS]) == 0
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
    # The floor is the quantiles of what the translations of the validation lines measure.
    val = (mt_run / "train.de").read_text().splitlines()
    fitted = translator.translate(val, beam=2, entropy=True)
    assert stored["score"] == pytest.approx(sorted(t.token_log_prob for t in fitted)[int(0.9 * len(val))], abs=1e-4)
    assert stored["entropy"] == pytest.approx(sorted(t.entropy for t in fitted)[int((1 - 0.9) * len(val))], abs=1e-4)
    # The export carries it.
    assert main(["export", str(run), str(tmp_path / "export")]) == 0
    capsys.readouterr()
    assert Translator.load(tmp_path / "export", device="cpu").confidence_floor == translator.confidence_floor
    # At the 0.9 quantile most of the training sentences are past the floor: stderr names every one of them.
    source = tmp_path / "in.de"
    lines = (mt_run / "train.de").read_text().splitlines()[:20]
    source.write_text("\n".join(lines) + "\n")
    rc, out, err = run_cli(capsys, ["translate", *common, "--input", str(source)])
    found = translator.translate(lines, beam=2)
    unsure = [i + 1 for i, t in enumerate(found) if t.unsure]
    assert unsure == [i + 1 for i, t in enumerate(found) if t.token_log_prob < stored["score"]
                      or t.entropy > stored["entropy"]]
    assert rc == 0 and len(out.splitlines()) == 20 and len(unsure) >= 2
    assert (f"the model is unsure of {len(unsure)} of 20 translations (lines {', '.join(map(str, unsure))}): "
            f"log-probability per token under {stored['score']:.2f} or next-token entropy over "
            f"{stored['entropy']:.2f}") in err
    # --json carries the flag of every hypothesis.
    rc, out, _ = run_cli(capsys, ["translate", *common, "--input", str(source), "--json"])
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["hypotheses"][0]["unsure"] for r in rows] == [t.unsure for t in found]


def _floor(run, **fields) -> None:
    (run / "confidence.json").write_text(json.dumps({"quantile": 0.05, "beam": 2, "fitted_on": "made", **fields}))


def test_translate_names_every_unsure_line_then_how_many_more(mt_run, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["export", str(mt_run / "run"), str(run)]) == 0
    common = ["translate", "--model", str(run), "--threads", "1", "--device", "cpu", "--beam", "2"]
    lines = (mt_run / "train.de").read_text().splitlines()[:25]
    source = tmp_path / "in.de"
    source.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")   # line 4 is empty
    # A floor every translation is under: all 25 unsure, the first 20 named, the empty line never
    _floor(run, score=1.0)
    capsys.readouterr()
    rc, out, err = run_cli(capsys, [*common, "--input", str(source)])
    named = [1, 2, 3, *range(5, 22)]
    assert rc == 0 and len(out.splitlines()) == 26
    assert f"unsure of 25 of 25 translations (lines {', '.join(map(str, named))} ... and 5 more)" in err
    # Lines read one at a time (a terminal, a pipe): each unsure one is named as it comes, then the summary.
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{lines[0]}\n\n{lines[1]}\n"))
    rc, out, err = run_cli(capsys, common)
    assert rc == 0 and len(out.splitlines()) == 3
    assert [int(n) for n in re.findall(r"line (\d+): the model is unsure of this translation", err)] == [1, 3]
    assert "unsure of 2 of 2 translations (lines 1, 3)" in err
    # The entropy alone: a floor no score is under, an entropy every translation is over
    _floor(run, score=-1e9, entropy=0.0)
    assert all(t.unsure for t in Translator.load(run, device="cpu").translate(lines, beam=2))
    # A floor nothing is past: no warning
    _floor(run, score=-1e9, entropy=1e9)
    rc, out, err = run_cli(capsys, [*common, "--input", str(source)])
    assert rc == 0 and "unsure" not in err


def test_fit_confidence_needs_a_model_folder(mt_run, capsys):
    assert_user_error(capsys, ["mt-eval", "--hyp", str(mt_run / "train.en"), "--ref", str(mt_run / "train.en"),
                               "--fit-confidence"], "leave out --fit-confidence")
    assert_user_error(capsys, ["mt-eval", "--model", str(mt_run / "run" / "checkpoint.pt"), "--src",
                               str(mt_run / "train.de"), "--ref", str(mt_run / "train.en"), "--threads", "1",
                               "--fit-confidence"], "writes into the model's folder")
