"""Top-k keeps its promise: ``answer(top_k=K)`` gives K distinct answers whenever the text has K, even when every
one of the first 4K candidate spans overlaps the best answer. The reader is a stand-in whose start and end logits
are set per word, so which spans overlap is known exactly (no trained model's whims)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fastqa.data.vocab import Vocab
from fastqa.tasks.qa import QAModel
from fastqa.tasks.qa.encoding import encode_pairs
from fastqa.tasks.qa.predictor import Answer
from fastqa.tasks.qa.squad import Limits
from fastqa.tasks.qa.inference import Passage, Query, ReadOptions, read_windows

WORDS = Vocab(["<pad>", "<unk>", "peak", "second"])
CHARS = Vocab(["<pad>", "<unk>"])
PEAK, SECOND, OTHER = 10.0, -3.0, -10.0


class _SetScores(nn.Module):
    """Start and end logits set per word: "peak" PEAK, "second" SECOND, every other word OTHER; a no-answer
    reader puts ``null`` first."""

    SPAN_LOGITS = True

    def __init__(self, no_answer: bool = False, null: float = -50.0) -> None:
        super().__init__()
        self.config = SimpleNamespace(no_answer=no_answer, single_word=False, max_word_len=16)
        self.bias = nn.Parameter(torch.zeros(()))
        self.null = null

    def forward(self, cw, cc, qw, qc, *, logits=False):
        out = torch.full(cw.shape, OTHER) + self.bias
        out = torch.where(cw == WORDS["peak"], PEAK, out)
        out = torch.where(cw == WORDS["second"], SECOND, out)
        out = out.masked_fill(cw == WORDS.pad_id, torch.finfo(out.dtype).min)
        if self.config.no_answer:
            out = torch.cat([torch.full((out.shape[0], 1), self.null), out], dim=1)
        assert logits
        return out, out


def _qa(no_answer: bool = False, context: int = 400) -> QAModel:
    return QAModel(_SetScores(no_answer), WORDS, CHARS, limits=Limits(context=context), device="cpu")


def _distinct(answers: list[Answer]) -> bool:
    return all(not (a.start < b.end and b.start < a.end) for i, a in enumerate(answers) for b in answers[:i])


# 40 words, "second" at 5 and "peak" at 20: the best span is "peak" (20); every span that starts or ends on it
# (about 40 of them, score PEAK + OTHER = 0) outranks "second" alone (2 * SECOND = -6), and every other span
# (OTHER + OTHER = -20) ranks below both.
TEXT = ["w"] * 40
TEXT[5], TEXT[20] = "second", "peak"
CONTEXT = " ".join(TEXT)


def test_the_first_4k_candidates_all_overlap_the_best():
    """The premise: reading 4K = 8 candidates for top_k=2 finds nothing but "peak" and spans holding it."""
    qa = _qa()
    (pair,) = encode_pairs([CONTEXT], ["Which?"], WORDS, CHARS, 16)
    (reading,) = read_windows(qa.model, [Passage(pair.context_words, pair.context_chars)],
                              [Query(pair.question_words, pair.question_chars, 0)], ReadOptions(k=8))
    assert len(reading.candidates) == 8
    assert all(c.start <= 20 <= c.end for c in reading.candidates)


@pytest.mark.parametrize("k, want", [(2, ["peak", "second"]), (3, ["peak", "second", "w"])])
def test_top_k_grows_the_pool_until_k_distinct_answers(k, want):
    qa = _qa()
    answers = qa.answer(CONTEXT, "Which?", top_k=k)
    assert [a.text for a in answers] == want
    assert _distinct(answers)
    assert answers[0].start == CONTEXT.index("peak") and answers[1].start == CONTEXT.index("second")
    assert all(CONTEXT[a.start:a.end] == a.text for a in answers)
    assert [a.score for a in answers] == sorted((a.score for a in answers), reverse=True)
    # The same through answer_many, in a batch with another text, and read in several windows.
    many = qa.answer_many([CONTEXT, "peak w"], ["Which?", "Which?"], top_k=k)
    assert [a.text for a in many[0]] == want
    windowed = qa.answer(CONTEXT, "Which?", top_k=k, max_context=16, stride=4)
    assert [a.text for a in windowed] == want and _distinct(windowed)


def test_top_k_stops_when_the_text_has_no_more():
    """Three words hold at most three distinct answers: asking for ten gives those three and ends."""
    answers = _qa().answer("w peak second", "Which?", top_k=10)
    assert sorted(a.text for a in answers) == ["peak", "second", "w"]
    assert answers[0].text == "peak" and _distinct(answers)


def test_top_k_with_a_no_answer_reader():
    """A v2.0 reader's "no answer" is one of the K, ranked by its score; the spans still grow to K distinct."""
    qa = _qa(no_answer=True)
    answers = qa.answer(CONTEXT, "Which?", top_k=3)
    assert [a.text for a in answers] == ["peak", "second", "w"]       # null (-50) ranks below them all
    assert all(a.no_answer_prob is not None for a in answers)
    qa.model.null = -8.0                                                # between "second" (-6) and "w" (-20)
    answers = qa.answer(CONTEXT, "Which?", top_k=3)
    assert [a.text for a in answers] == ["peak", "second", ""]


def test_widen_keeps_the_smaller_pool_first_and_ends_with_every_span():
    qa = _qa()
    (pair,) = encode_pairs(["w w peak w w"], ["Which?"], WORDS, CHARS, 16)
    for max_context in (None, 3):     # one window, and three overlapping ones
        (reading,) = read_windows(qa.model, [Passage(pair.context_words, pair.context_chars)],
                                  [Query(pair.question_words, pair.question_chars, 0)],
                                  ReadOptions(k=3, keep_scores=True, max_context=max_context, stride=1))
        first = [c.log_score for c in reading.candidates]
        assert reading.can_widen and first[0] == 2 * PEAK
        reading.widen(6)
        assert [c.log_score for c in reading.candidates][:3] == first
        assert (reading.candidates[0].start, reading.candidates[0].end) == (2, 2)
        reading.widen(100)
        # every span (i <= j) that lies inside a window, once however many windows saw it
        inside = {(i, j) for a, b in reading.windows for i in range(a, b) for j in range(i, b)}
        assert len(inside) == (15 if max_context is None else 11)
        spans = [(c.start, c.end) for c in reading.candidates]
        assert len(spans) == len(set(spans)) and set(spans) == inside
        assert [(-c.log_score, c.start, c.end) for c in reading.candidates] == sorted(
            (-c.log_score, c.start, c.end) for c in reading.candidates)
        assert not reading.can_widen
    (plain,) = read_windows(qa.model, [Passage(pair.context_words, pair.context_chars)],
                            [Query(pair.question_words, pair.question_chars, 0)], ReadOptions(k=3))
    assert not plain.can_widen
    with pytest.raises(RuntimeError, match="keep_scores"):
        plain.widen(6)
