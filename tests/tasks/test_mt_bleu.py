"""BLEU: the tutorial's tokenized BLEU (torchtext bleu_score semantics) and sacrebleu on detokenized text."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from fastqa.data.tokenize import detokenize
from fastqa.tasks.translation.bleu import corpus_bleu, tokenized_bleu


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


def test_corpus_bleu_on_detokenized_text():
    tokens = ["a", "man", ",", "in", "a", "red", "shirt", ",", "smiles", "."]
    text = detokenize(tokens)
    assert text == "a man, in a red shirt, smiles."
    assert detokenize([]) == ""
    r = corpus_bleu([text, "two dogs play in the snow."], ["a man, in a red shirt, smiles.",
                                                            "two dogs play in the snow."])
    assert r.score == pytest.approx(100.0)
    assert r.line.startswith("BLEU|nrefs:1|case:mixed|") and "tok:13a" in r.line and "= 100.00" in r.line
    # Case: a lowercased model scored against cased references only matches with lowercase=True.
    cased = corpus_bleu(["a man smiles at the dog ."], ["A man smiles at the Dog ."])
    lc = corpus_bleu(["a man smiles at the dog ."], ["A man smiles at the Dog ."], lowercase=True)
    assert cased.score < 100.0 and lc.score == pytest.approx(100.0) and "case:lc" in lc.line
    with pytest.raises(ValueError, match="1 hypotheses and 2 references"):
        corpus_bleu(["a"], ["a", "b"])
