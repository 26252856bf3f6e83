"""sacreBLEU and chrF with signatures: equal to sacrebleu's own API, cased by default, lowercase on request."""
from __future__ import annotations

import json
import random

import pytest

sacrebleu = pytest.importorskip("sacrebleu")

from fastqa.data.scores import corpus_scores, format_scores  # noqa: E402


def _pairs(n: int = 40, seed: int = 0) -> tuple[list[str], list[str]]:
    """References and noisy hypotheses: dropped, swapped and re-cased words, punctuation."""
    rng = random.Random(seed)
    words = ["Ein", "Mann", "fährt", "ein", "rotes", "Fahrrad", "Die", "Frau", "liest", "Zeitung", "im", "Park",
             "two", "dogs", "Play", "in", "the", "snow", "A", "child"]
    refs, hyps = [], []
    for _ in range(n):
        ref = [rng.choice(words) for _ in range(rng.randint(4, 12))]
        hyp = [w for w in ref if rng.random() > 0.15]
        hyp = [w.upper() if rng.random() < 0.1 else w for w in hyp]
        if len(hyp) > 2 and rng.random() < 0.5:
            i = rng.randrange(len(hyp) - 1)
            hyp[i], hyp[i + 1] = hyp[i + 1], hyp[i]
        refs.append(" ".join(ref) + ".")
        hyps.append(" ".join(hyp) + rng.choice([".", "", " ."]))
    return hyps, refs


def test_equal_to_sacrebleu_api():
    hyps, refs = _pairs()
    s = corpus_scores(hyps, refs)
    assert s["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert s["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert 0 < s["bleu"] < 100 and 0 < s["chrf"] < 100
    assert s["sentences"] == len(hyps) and s["lowercase"] is False


def test_default_signatures():
    s = corpus_scores(*_pairs())
    assert "case:mixed" in s["bleu_signature"] and "tok:13a" in s["bleu_signature"]
    assert "case:mixed" in s["chrf_signature"] and "nc:6" in s["chrf_signature"]
    assert s["bleu_line"].startswith("BLEU|") and s["bleu_signature"] in s["bleu_line"]
    assert s["chrf_line"].startswith("chrF2|") and s["chrf_signature"] in s["chrf_line"]


def test_lowercase_variant():
    hyps, refs = _pairs()
    cased, lc = corpus_scores(hyps, refs), corpus_scores(hyps, refs, lowercase=True)
    assert lc["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    # corpus_chrf has no lowercase argument: its class has, and lowercasing the text first is the same
    assert lc["chrf"] == sacrebleu.metrics.CHRF(lowercase=True).corpus_score(hyps, [refs]).score
    assert lc["chrf"] == sacrebleu.corpus_chrf([h.lower() for h in hyps], [[r.lower() for r in refs]]).score
    assert "case:lc" in lc["bleu_signature"] and "case:lc" in lc["chrf_signature"]
    assert lc["bleu"] > cased["bleu"]  # the hypotheses have upper-cased words
    assert lc["lowercase"] is True


def test_case_matters_by_default():
    refs = ["The cat sits on the mat ."]
    shouted = ["the CAT SITS on THE MAT ."]
    assert corpus_scores(shouted, refs)["bleu"] < 50 < corpus_scores(refs, refs)["bleu"] == pytest.approx(100.0)
    assert corpus_scores(shouted, refs, lowercase=True)["bleu"] == pytest.approx(100.0)
    assert corpus_scores(shouted, refs)["chrf"] < corpus_scores(shouted, refs, lowercase=True)["chrf"]


def test_scoring_files_equals_sacrebleu_on_the_same_files(tmp_path):
    # What `mt-eval --hyp FILE` does: read a translation file and its references, score the lines.
    hyps, refs = _pairs(seed=3)
    hyp_file, ref_file = tmp_path / "hyp.en", tmp_path / "ref.en"
    hyp_file.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    ref_file.write_text("\n".join(refs) + "\n", encoding="utf-8")
    read_hyps = hyp_file.read_text(encoding="utf-8").split("\n")[:-1]
    read_refs = ref_file.read_text(encoding="utf-8").split("\n")[:-1]
    s = corpus_scores(read_hyps, read_refs)
    with open(hyp_file, encoding="utf-8") as h, open(ref_file, encoding="utf-8") as r:
        sys_lines = [line.rstrip("\n") for line in h]
        ref_lines = [line.rstrip("\n") for line in r]
    assert s["bleu"] == sacrebleu.corpus_bleu(sys_lines, [ref_lines]).score
    assert s["chrf"] == sacrebleu.corpus_chrf(sys_lines, [ref_lines]).score


def test_json_ready_and_formatted():
    s = corpus_scores(*_pairs())
    assert json.loads(json.dumps(s)) == s
    line = format_scores(s)
    assert "\n" not in line
    assert line.startswith(f"BLEU = {s['bleu']:.2f} (")
    assert f"chrF = {s['chrf']:.2f} ({s['chrf_signature']})" in line


def test_bad_input():
    with pytest.raises(ValueError, match="3 hypotheses and 2 references"):
        corpus_scores(["a", "b", "c"], ["a", "b"])
    with pytest.raises(TypeError, match="hypotheses"):
        corpus_scores("a b c", ["a b c"])
    with pytest.raises(TypeError, match=r"references\[1\]"):
        corpus_scores(["a", "b"], ["a", None])
    with pytest.raises(ValueError, match="empty"):
        corpus_scores([], [])
    with pytest.raises(TypeError, match="lowercase"):
        corpus_scores(["a"], ["a"], lowercase="yes")
    with pytest.raises(ValueError, match="bleu_signature"):
        format_scores({"bleu": 1.0})
    with pytest.raises(TypeError, match="scores"):
        format_scores([1.0])
