"""The engines of ``fastqa serve`` without a server or a trained model: the top-k spans against brute force,
the use of the newer ``QAModel.answer(top_k=)`` / ``Translator.translate(nbest=, attention=)`` only where the
class has them, one call at a time per model, and the bounded queue."""
from __future__ import annotations

import asyncio
import random
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from fastqa.errors import UserError
from fastqa.serve.engines import Busy, ModelWorker, QAEngine, TranslationEngine, accepts, top_spans
from fastqa.serve.limits import ServeLimits


def _probabilities(n: int, seed: int, single_word: bool = False) -> tuple[str, dict]:
    """A context of n words and made-up start/end distributions over them, as QAModel.probabilities gives."""
    rng = random.Random(seed)
    words = [rng.choice(["ka", "lo", "Zoë", "北京", "🎻", "mi"]) + str(i) for i in range(n)]
    context, offsets = "", []
    for w in words:
        context += rng.choice([" ", "  ", "\t"])
        offsets.append((len(context), len(context) + len(w)))
        context += w
    g = torch.Generator().manual_seed(seed)
    p_start = torch.softmax(torch.randn(n, generator=g) * 2, 0).tolist()
    p_end = None if single_word else torch.softmax(torch.randn(n, generator=g) * 2, 0).tolist()
    return context, {"tokens": words, "offsets": offsets, "p_start": p_start, "p_end": p_end, "p_null": None}


@pytest.mark.parametrize("n,max_len,k", [(1, 30, 5), (7, 0, 3), (9, 1, 4), (12, 3, 20), (40, 30, 10)])
def test_top_spans_match_brute_force(n, max_len, k):
    context, probs = _probabilities(n, seed=n * 100 + max_len)
    spans = [(probs["p_start"][i] * probs["p_end"][j], i, j)
             for i in range(n) for j in range(i, min(n, i + max_len + 1))]
    want = sorted(spans, key=lambda s: -s[0])[:k]
    got = top_spans(probs, context, k, max_len)
    assert len(got) == min(k, len(spans))
    assert [g["score"] for g in got] == pytest.approx([w[0] for w in want], rel=1e-12)
    for g in got:
        assert context[g["start"]:g["end"]] == g["text"]
        assert g["score"] <= got[0]["score"]


def test_top_spans_of_a_single_word_reader():
    context, probs = _probabilities(6, seed=1, single_word=True)
    got = top_spans(probs, context, 3, 30)
    order = sorted(range(6), key=lambda i: -probs["p_start"][i])[:3]
    assert [g["text"] for g in got] == [probs["tokens"][i] for i in order]


class _Reader:
    """A stand-in for QAModel as it is now: answer() without top_k, and probabilities()."""

    max_answer_len = 30

    def __init__(self):
        self.context, self.probs = _probabilities(10, seed=5)
        self.calls: list[str] = []

    def answer(self, context, question, *, max_answer_len=None):
        self.calls.append("answer")
        best = top_spans(self.probs, context, 1, self.max_answer_len if max_answer_len is None else max_answer_len)[0]
        return dict(best)

    def probabilities(self, context, question):
        self.calls.append("probabilities")
        return self.probs


def test_qa_engine_without_native_top_k_ranks_spans_from_the_probabilities():
    reader = _Reader()
    engine = QAEngine(reader)
    assert not engine.native_top_k and engine.describe()["top_k"] == "spans"
    one = engine.answer(reader.context, "q?")
    assert reader.calls == ["answer"] and one["top_k"] == [one["answer"]]
    five = engine.answer(reader.context, "q?", top_k=5)
    assert reader.calls[1:] == ["answer", "probabilities"]
    assert len(five["top_k"]) == 5 and five["top_k"][0]["text"] == five["answer"]["text"]
    narrow = engine.answer(reader.context, "q?", top_k=3, max_answer_len=0)  # one-token spans: no whitespace
    assert len(narrow["top_k"]) == 3 and all(len(span["text"].split()) == 1 for span in narrow["top_k"])


@pytest.mark.parametrize("shape", ["answers", "answers+no_answer_prob", "list"])
def test_qa_engine_passes_top_k_through_when_the_reader_takes_it(shape):
    answers = [{"text": t, "score": s, "start": 0, "end": len(t)} for t, s in (("ab", .5), ("a", .3), ("b", .1))]

    class Reader:
        max_answer_len = 30

        def answer(self, context, question, *, max_answer_len=None, top_k=None):
            if top_k is None:
                return answers[0]
            assert top_k == 3
            if shape == "list":
                return answers
            return {"answers": answers, **({"no_answer_prob": 0.25} if "no_answer" in shape else {})}

        def probabilities(self, context, question):
            raise AssertionError("the reader ranks its own answers")

    engine = QAEngine(Reader())
    assert engine.native_top_k and engine.describe()["top_k"] == "model"
    out = engine.answer("ab", "q?", top_k=3)
    assert out["top_k"] == answers
    assert out["answer"] == ({**answers[0], "no_answer_prob": 0.25} if "no_answer" in shape else answers[0])
    assert engine.answer("ab", "q?") == {"answer": answers[0], "top_k": [answers[0]]}


def test_accepts_needs_an_explicit_keyword():
    def explicit(a, *, top_k=1): ...
    def catch_all(a, **kwargs): ...
    assert accepts(explicit, "top_k") and not accepts(catch_all, "top_k") and not accepts(len, "top_k")


class _AttentionMap(SimpleNamespace):
    pass


class _OldTranslator:
    """A stand-in for a Translator without n-best: translate() and attention()."""

    def __init__(self):
        self.calls: list[tuple] = []

    def translate(self, sentences, *, beam=5, incremental=True, **kwargs):
        self.calls.append(("translate", tuple(sentences), beam))
        return [s.upper() for s in sentences]

    def attention(self, sentence, *, beam=1, **kwargs):
        self.calls.append(("attention", sentence, beam))
        toks = sentence.split()
        return _AttentionMap(source=[*toks, "<eos>"], target=[*[t.upper() for t in toks], "<eos>"],
                             weights=torch.eye(len(toks) + 1))


def test_translation_engine_takes_the_attention_from_translator_attention():
    model = _OldTranslator()
    engine = TranslationEngine(model)
    assert not engine.native_nbest and not engine.describe()["nbest"]
    rows = engine.translate(["ka lo", "  "], beam=3, attention=True)
    assert [r["text"] for r in rows] == ["KA LO", "  "]
    assert rows[0]["attention"] == {"source": ["ka", "lo", "<eos>"], "target": ["KA", "LO", "<eos>"],
                                    "weights": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}
    assert rows[1]["attention"] is None
    assert model.calls == [("translate", ("ka lo", "  "), 3), ("attention", "ka lo", 3)]
    assert "attention" not in engine.translate(["ka"], beam=1)[0]
    with pytest.raises(UserError, match="nbest"):
        engine.translate(["ka"], nbest=2)


def test_translation_engine_uses_nbest_and_attention_of_the_search_when_there():
    class Translator:
        def translate(self, sentences, *, beam=5, incremental=True, nbest=None, attention=False, **kwargs):
            assert nbest is not None
            amap = _AttentionMap(source=["a", "<eos>"], target=["A", "<eos>"], weights=[[0.25, 0.75], [0.5, 0.5]])
            return [[SimpleNamespace(text=s.upper() + str(i), score=-i, attention=amap if attention and i == 0 else None)
                     for i in range(nbest)] if s.strip() else [] for s in sentences]

    engine = TranslationEngine(Translator())
    assert engine.native_nbest
    rows = engine.translate(["a", ""], beam=4, attention=True, nbest=2)
    assert rows[0]["text"] == "A0" and rows[0]["nbest"] == [{"text": "A0", "score": 0.0}, {"text": "A1", "score": -1.0}]
    assert rows[0]["attention"]["weights"] == [[0.25, 0.75], [0.5, 0.5]]
    assert rows[1] == {"source": "", "text": "", "attention": None, "nbest": []}


def test_a_worker_runs_one_call_at_a_time_and_bounds_its_queue():
    worker = ModelWorker(object(), name="test", max_pending=8)
    active, most = [0], [0]
    lock = threading.Lock()

    def work(i):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        with lock:
            active[0] -= 1
        return i

    async def scenario():
        results = await asyncio.gather(*(worker.run(work, i) for i in range(8)))
        assert results == list(range(8))
        release = threading.Event()
        first = asyncio.ensure_future(worker.run(release.wait, 10))
        others = [asyncio.ensure_future(worker.run(lambda: 1)) for _ in range(7)]
        await asyncio.sleep(0.05)
        with pytest.raises(Busy, match="8 requests waiting"):
            await worker.run(lambda: 1)
        release.set()
        assert await first is True and await asyncio.gather(*others) == [1] * 7
        assert worker.pending == 0

    try:
        asyncio.run(scenario())
    finally:
        worker.close()
    assert most[0] == 1


def test_limits_must_be_positive():
    assert ServeLimits().to_dict()["max_body_bytes"] == 1 << 20
    with pytest.raises(ValueError, match="max_beam"):
        ServeLimits(max_beam=0)
