"""Translation scores: sacreBLEU and chrF with signatures (equal to sacrebleu's own API, cased by default,
lowercase on request) and the tutorial's tokenized BLEU (torchtext bleu_score semantics)."""
from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest

sacrebleu = pytest.importorskip("sacrebleu")

from fastqa.data.tokenize import detokenize  # noqa: E402
from fastqa.tasks.translation.bleu import (  # noqa: E402
    CorpusScores,
    corpus_scores,
    format_scores,
    text_tokenized_bleu,
    tokenized_bleu,
)


def _torchtext_bleu(candidates, references, max_n=4):
    """torchtext.data.metrics.bleu_score's formula, written out independently (one reference each):
    clipped n-gram counts summed over the corpus, uniform weights, no smoothing, 0 when an order has no
    match, brevity penalty exp(1 - r/c) when c < r. Returns a value in [0, 1]."""
    clipped = [0] * max_n
    totals = [0] * max_n
    c_len = r_len = 0
    for cand, ref in zip(candidates, references):
        c_len += len(cand)
        r_len += len(ref)
        for n in range(1, max_n + 1):
            c = Counter(tuple(cand[i:i + n]) for i in range(len(cand) - n + 1))
            r = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
            clipped[n - 1] += sum((c & r).values())
            totals[n - 1] += max(len(cand) - n + 1, 0)
    if min(clipped) == 0:
        return 0.0
    log_p = sum(math.log(clipped[i] / totals[i]) for i in range(max_n)) / max_n
    bp = math.exp(min(1 - r_len / c_len, 0))
    return bp * math.exp(log_p)


def test_tokenized_bleu_hand_computed():
    hyp = "the cat sat on the mat".split()
    ref = "the cat sat on a mat".split()
    # unigrams 5/6 ("the" clipped to 1), bigrams 3/5, trigrams 2/4, 4-grams 1/3; equal lengths: BP 1.
    r = tokenized_bleu([hyp], [ref])
    assert r.score == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-9)
    assert r.precisions == pytest.approx((100 * 5 / 6, 60.0, 50.0, 100 / 3))
    assert r.bp == 1.0
    # Every n-gram right but one token short: BLEU = BP = exp(1 - 5/4).
    r = tokenized_bleu([["a", "b", "c", "d"]], [["a", "b", "c", "d", "e"]])
    assert r.score == pytest.approx(100 * math.exp(-0.25), abs=1e-9)
    # Identical corpus: 100.
    assert tokenized_bleu([hyp, ref], [hyp, ref]).score == pytest.approx(100.0)


def test_tokenized_bleu_is_unsmoothed_and_lowercases():
    # No 4-gram in common: 0 exactly (torchtext does not smooth), although lower orders match.
    assert tokenized_bleu([["a", "b", "c", "x", "d", "e"]], [["a", "b", "c", "y", "d", "e"]]).score == 0.0
    assert tokenized_bleu([["Two", "Dogs", "run", "fast", "."]], [["two", "dogs", "run", "fast", "."]]).score \
        == pytest.approx(100.0)
    assert tokenized_bleu([["Two", "Dogs", "run", "fast", "."]], [["two", "dogs", "run", "fast", "."]],
                          lowercase=False).score < 100.0


@pytest.mark.parametrize("seed", range(5))
def test_tokenized_bleu_matches_torchtext_formula(seed):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(6)] + [",", ".", "n't"]
    refs, hyps = [], []
    for _ in range(40):
        ref = [rng.choice(words) for _ in range(rng.randint(1, 15))]
        hyp = [t for t in ref if rng.random() > 0.2] + [rng.choice(words) for _ in range(rng.randint(0, 3))]
        rng.shuffle(hyp) if rng.random() < 0.2 else None
        refs.append(ref)
        hyps.append(hyp)
    hyps[0] = []  # an empty hypothesis counts as length 0 with no n-grams
    want = 100 * _torchtext_bleu(hyps, refs)
    assert want > 1.0  # the corpus is not degenerate
    assert tokenized_bleu(hyps, refs).score == pytest.approx(want, rel=1e-12, abs=1e-9)


def test_tokenized_bleu_bad_input():
    with pytest.raises(ValueError, match="2 hypotheses and 1 references"):
        tokenized_bleu([["a"], ["b"]], [["a"]])
    with pytest.raises(ValueError, match=r"hypotheses\[0\].*whitespace"):
        tokenized_bleu([["a b"]], [["a"]])
    with pytest.raises(TypeError, match=r"references\[0\]"):
        tokenized_bleu([["a"]], ["a"])
    with pytest.raises(TypeError):
        tokenized_bleu("a b", "a b")


def test_text_tokenized_bleu_uses_lowercased_spacy_tokens():
    hyps = ["A man, in a red shirt, smiles.", "Two dogs play."]
    refs = ["a man , in a red shirt , smiles .", "two dogs play in the snow."]
    want = tokenized_bleu([["a", "man", ",", "in", "a", "red", "shirt", ",", "smiles", "."], ["two", "dogs", "play", "."]],
                          [["a", "man", ",", "in", "a", "red", "shirt", ",", "smiles", "."],
                           ["two", "dogs", "play", "in", "the", "snow", "."]])
    assert text_tokenized_bleu(hyps, refs, "en") == want
    with pytest.raises(ValueError, match="2 hypotheses and 1 references"):
        text_tokenized_bleu(hyps, refs[:1], "en")


def test_corpus_scores_on_detokenized_text():
    tokens = ["a", "man", ",", "in", "a", "red", "shirt", ",", "smiles", "."]
    text = detokenize(tokens)
    assert text == "a man, in a red shirt, smiles."
    assert detokenize([]) == ""
    r = corpus_scores([text, "two dogs play in the snow."], ["a man, in a red shirt, smiles.",
                                                             "two dogs play in the snow."])
    assert r.bleu.score == pytest.approx(100.0) and r.chrf.score == pytest.approx(100.0)
    assert r.bleu.line.startswith("BLEU|nrefs:1|case:mixed|") and "tok:13a" in r.bleu.line
    assert "= 100.00" in r.bleu.line and r.chrf.line.startswith("chrF2|nrefs:1|case:mixed|")
    # Case: a lowercased model scored against cased references only matches with lowercase=True.
    cased = corpus_scores(["a man smiles at the dog ."], ["A man smiles at the Dog ."])
    lc = corpus_scores(["a man smiles at the dog ."], ["A man smiles at the Dog ."], lowercase=True)
    assert cased.bleu.score < 100.0 and lc.bleu.score == pytest.approx(100.0) and "case:lc" in lc.bleu.line
    with pytest.raises(ValueError, match="1 hypotheses and 2 references"):
        corpus_scores(["a"], ["a", "b"])


# --- sacreBLEU and chrF: equal to sacrebleu's own API ------------------------------------------------------

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
    assert isinstance(s, CorpusScores)
    want = sacrebleu.corpus_bleu(hyps, [refs])
    assert s.bleu.score == want.score and s.bleu.bp == want.bp and list(s.bleu.precisions) == want.precisions
    assert s.chrf.score == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert 0 < s.bleu.score < 100 and 0 < s.chrf.score < 100
    assert s.sentences == len(hyps) and s.lowercase is False


def test_default_signatures():
    s = corpus_scores(*_pairs()).to_dict()
    assert "case:mixed" in s["bleu_signature"] and "tok:13a" in s["bleu_signature"]
    assert "case:mixed" in s["chrf_signature"] and "nc:6" in s["chrf_signature"]
    assert s["bleu_line"].startswith("BLEU|") and s["bleu_signature"] in s["bleu_line"]
    assert s["chrf_line"].startswith("chrF2|") and s["chrf_signature"] in s["chrf_line"]


def test_lowercase_variant():
    hyps, refs = _pairs()
    cased, lc = corpus_scores(hyps, refs), corpus_scores(hyps, refs, lowercase=True)
    assert lc.bleu.score == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    # corpus_chrf has no lowercase argument: its class has, and lowercasing the text first is the same
    assert lc.chrf.score == sacrebleu.metrics.CHRF(lowercase=True).corpus_score(hyps, [refs]).score
    assert lc.chrf.score == sacrebleu.corpus_chrf([h.lower() for h in hyps], [[r.lower() for r in refs]]).score
    assert "case:lc" in lc.bleu.signature and "case:lc" in lc.chrf.signature
    assert lc.bleu.score > cased.bleu.score  # the hypotheses have upper-cased words
    assert lc.lowercase is True


def test_case_matters_by_default():
    refs = ["The cat sits on the mat ."]
    shouted = ["the CAT SITS on THE MAT ."]
    assert corpus_scores(shouted, refs).bleu.score < 50 < corpus_scores(refs, refs).bleu.score == pytest.approx(100.0)
    assert corpus_scores(shouted, refs, lowercase=True).bleu.score == pytest.approx(100.0)
    assert corpus_scores(shouted, refs).chrf.score < corpus_scores(shouted, refs, lowercase=True).chrf.score


def test_json_ready_and_formatted():
    s = corpus_scores(*_pairs())
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d
    line = format_scores(s)
    assert "\n" not in line and line == s.format() == format_scores(d)
    assert line.startswith(f"BLEU = {s.bleu.score:.2f} (")
    assert f"chrF = {s.chrf.score:.2f} ({s.chrf.signature})" in line


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
