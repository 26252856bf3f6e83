"""A reader ready to use: the shipped model by name (``fastqa.pretrained``), contexts of any length read in
overlapping windows, top-k answers, JSON-lines batches (``ask --input``), and the ``ask --plot`` figure on
long contexts. All data is generated; the shipped folder is a temporary one holding a tiny export."""
from __future__ import annotations

import contextlib
import json
import math
import random
import re
import struct
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import assert_user_error, run_cli
from helpers import SEED_ARGS
from squad_fixtures import make_squad, write_json
from torch import nn

import fastqa.pretrained as pretrained
from fastqa.data.vocab import Vocab
from fastqa.errors import UserError
from fastqa.tasks.qa import QAModel
from fastqa.tasks.qa.spans import decode_top_spans
from fastqa.tasks.qa.predictor import Answer
from fastqa.tasks.qa.squad import Limits
from fastqa.tasks.qa.inference import lexical_terms, paragraph_starts, plan_windows, window_settings

TINY = ["--set", "d_model=32", "--set", "heads=2", "--set", "char_dim=16", "--set", "char_channels=32",
        "--set", "word_dim=32", "--set", "emb_conv_layers=1", "--set", "model_blocks=1", "--set", "dropout=0",
        "--set", "char_dropout=0", "--set", "layer_dropout=0"]
LOREM = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
         "dolore magna aliqua").split()
FILLER = ". " * 10_000    # 10,000 tokens before the paragraph: the answer lies in the last of ~37 windows


def _train_args(train, out, *extra) -> list:
    return ["qa-train", "--train", train, "--dev", train, "--out", out, "--no-cache", "--no-progress",
            "--lr", "3e-3", "--warmup", "20", "--batch-size", "16", "--threads", "1", "--eval-every", "0",
            *TINY, *SEED_ARGS, *extra]


def _padded_with_lorem(obj: dict, seed: int, most: int = 30) -> dict:
    """``obj`` with up to ``most`` filler words before and after every paragraph (answer offsets moved), so
    the reader learns that text around a paragraph is never the answer: what a window of a long text holds."""
    rng = random.Random(seed)
    out = json.loads(json.dumps(obj))
    for article in out["data"]:
        for p in article["paragraphs"]:
            pre = " ".join(rng.choice(LOREM) for _ in range(rng.randint(0, most))) + " "
            post = " " + " ".join(rng.choice(LOREM) for _ in range(rng.randint(0, most)))
            p["context"] = pre + p["context"] + post
            for q in p["qas"]:
                for a in q["answers"]:
                    a["answer_start"] += len(pre)
    return out


@pytest.fixture(scope="module")
def reader(tmp_path_factory) -> dict:
    """A tiny QANet that has memorised 96 generated questions (paragraphs padded with filler words)."""
    from fastqa.cli import main

    root = tmp_path_factory.mktemp("ready")
    plain = make_squad(articles=2, paragraphs=6, people=2, seed=11)
    train = write_json(root / "train.json", _padded_with_lorem(plain, seed=5))
    assert main([str(a) for a in _train_args(train, root / "run", "--max-steps", "250")]) == 0
    return {"root": root, "run": root / "run", "plain": plain, "train": train,
            "paragraph": plain["data"][1]["paragraphs"][3]}


@pytest.fixture(scope="module")
def qa(reader) -> QAModel:
    return QAModel.load(reader["run"])


@contextlib.contextmanager
def _rows_seen(model: nn.Module) -> Iterator[list[tuple[int, int]]]:
    """The [B, n] shape of the context every forward of ``model`` receives inside the block."""
    seen: list[tuple[int, int]] = []
    handle = model.register_forward_pre_hook(lambda m, inputs: seen.append(tuple(inputs[0].shape)))
    try:
        yield seen
    finally:
        handle.remove()


# ------------------------------------------------------------------------------------------------- windows

def test_window_plan_covers_the_context_with_the_overlap_asked_for():
    assert plan_windows(7, 10, 3) == [(0, 7)]
    assert plan_windows(10, 10, 3) == [(0, 10)]
    assert plan_windows(5000, None, 128) == [(0, 5000)]
    for n, size, stride in [(11, 10, 3), (1000, 400, 128), (10_033, 400, 128), (57, 8, 0), (400, 399, 398)]:
        windows = plan_windows(n, size, stride)
        assert windows[0][0] == 0 and windows[-1][1] == n
        assert all(b - a == size for a, b in windows)
        for (a0, b0), (a1, b1) in zip(windows, windows[1:]):
            assert a0 < a1 and b0 - a1 >= stride            # overlap of at least `stride` tokens, always progress
    # Paragraphs: one window each where the text is longer than a window; a long paragraph is cut as above.
    assert plan_windows(1000, 400, 128, breaks=[900, 300, 350]) == [(0, 300), (300, 350), (350, 750), (500, 900),
                                                                    (900, 1000)]
    assert plan_windows(390, 400, 128, breaks=[100]) == [(0, 390)]          # it fits one window: read whole
    text = "Alpha beta.\n\nGamma delta.\n  \nEpsilon\nzeta"
    tokens = [(m.start(), m.end()) for m in re.finditer(r"\w+|\.", text)]
    assert paragraph_starts(text, tokens) == [3, 6]                          # a single newline is no break
    assert window_settings(None, None, 400) == (400, 128)
    assert window_settings(100, None, 400) == (100, 50)     # the default stride is at most half a window
    with pytest.raises(UserError, match="stride 50 must be smaller than max_context 50"):
        window_settings(50, 50, 400)
    with pytest.raises(UserError, match="max_context must be an int >= 1"):
        window_settings(0, None, 400)


class _Needle(nn.Module):
    """A stand-in reader: all the start and end probability on the word ``needle``, wherever it is."""

    def __init__(self, needle: int, no_answer: bool = False) -> None:
        super().__init__()
        self.config = SimpleNamespace(no_answer=no_answer, single_word=False, max_word_len=16)
        self.bias = nn.Parameter(torch.zeros(()))
        self.needle = needle

    def forward(self, cw, cc, qw, qc):
        logits = (cw == self.needle).float() * 30.0 + self.bias
        logits = logits.masked_fill(cw == 0, float("-inf"))
        if self.config.no_answer:
            logits = torch.cat([torch.full_like(logits[:, :1], 5.0), logits], 1)
        return F.log_softmax(logits, 1), F.log_softmax(logits, 1)


def _needle_reader(context_limit: int, no_answer: bool = False) -> QAModel:
    words = Vocab(["<pad>", "<unk>", "needle"])
    chars = Vocab(["<pad>", "<unk>"])
    return QAModel(_Needle(words["needle"], no_answer), words, chars, limits=Limits(context=context_limit),
                   device="cpu")


def test_windows_find_an_answer_anywhere_with_offsets_into_the_whole_text():
    qa = _needle_reader(context_limit=400)
    words = [f"w{i}" for i in range(10_000)]
    for where in (0, 271, 272, 5_000, 9_871, 9_999):            # window starts, overlaps, the very end
        text = words.copy()
        text[where] = "needle"
        context = "  ".join(text)
        with _rows_seen(qa.model) as seen:
            res = qa.answer(context, "Where is it?", batch_size=8)
        assert res.text == "needle" and context[res.start:res.end] == "needle"
        assert res.start == context.index("needle")
        assert max(n for _, n in seen) <= 400 and max(b for b, _ in seen) <= 8
        assert sum(b for b, _ in seen) == len(plan_windows(10_000, 400, 128))
    # a smaller window and overlap, through answer_many and the no-answer merge
    context = " ".join(words[:3000] + ["needle"] + words[3000:])
    many = qa.answer_many([context, "needle"], ["Q?", "Q?"], max_context=50, stride=10)
    assert [r.text for r in many] == ["needle", "needle"]
    assert all(r.no_answer_prob is None for r in many)                  # a v1.1 reader has no "no answer"
    v2 = _needle_reader(context_limit=64, no_answer=True)
    res = v2.answer(context, "Q?")
    assert res.text == "needle" and res.no_answer_prob < 0.5     # the window holding it decides
    res = v2.answer(" ".join(words[:1000]), "Q?")
    assert res.text == "" and res.no_answer_prob > 0.5 and not res.abstained


class _Scorer(nn.Module):
    """A stand-in reader with span logits: ``scores`` gives a word's start and end logit (other words -10)."""

    SPAN_LOGITS = True

    def __init__(self, scores: dict[int, float]) -> None:
        super().__init__()
        self.config = SimpleNamespace(no_answer=False, single_word=False, max_word_len=16)
        self.bias = nn.Parameter(torch.zeros(()))
        self.scores = scores

    def forward(self, cw, cc, qw, qc, *, logits=False):
        out = torch.full(cw.shape, -10.0) + self.bias
        for word, value in self.scores.items():
            out = torch.where(cw == word, value, out)
        out = out.masked_fill(cw == 0, torch.finfo(out.dtype).min)
        return (out, out) if logits else (F.log_softmax(out, 1), F.log_softmax(out, 1))


def test_spans_are_ranked_across_windows_by_logits_and_the_windows_relevance():
    words = Vocab(["<pad>", "<unk>", "decoy", "needle"])
    chars = Vocab(["<pad>", "<unk>"])

    def reader(needle_logit: float, per_window: bool = False) -> QAModel:
        model = _Scorer({words["decoy"]: 8.0, words["needle"]: needle_logit})
        if per_window:
            model.SPAN_LOGITS = False
        return QAModel(model, words, chars, limits=Limits(context=50), device="cpu")

    # Three windows of 50 words ([0, 50), [40, 90), [80, 130)): a "decoy" in each of the first two, "needle"
    # and a rare word in the last.
    text = [f"w{i % 7}" for i in range(130)]
    for i in (10, 60):
        text[i] = "decoy"
    text[120], text[125] = "needle", "zorbland"
    context = " ".join(text)
    # With a decoy beside the needle too, each window's own softmax makes the lone decoys certain and the needle
    # less so: per-window ranking prefers a decoy, the logits the needle scored above every decoy.
    crowded = text.copy()
    crowded[100] = "decoy"
    assert reader(9.0, per_window=True).answer(" ".join(crowded), "Which?", stride=10).text == "decoy"
    assert reader(9.0).answer(" ".join(crowded), "Which?", stride=10).text == "needle"
    # Logits compare between windows: a needle scored above the decoys wins, one scored below does not ...
    assert reader(9.0).answer(context, "Which?", stride=10).text == "needle"
    assert reader(7.0).answer(context, "Which?", stride=10).text == "decoy"
    # ... unless its window is the one that holds the question's rare word: one occurrence in one window of three
    # is worth about 2 logits here (a function word counts for nothing).
    assert reader(7.5).answer(context, "Which is the ?", stride=10).text == "decoy"
    found = reader(7.5).answer(context, "Which is the zorbland?", stride=10)
    assert found.text == "needle" and context[found.start:found.end] == "needle"
    # Scores are one softmax over the document: the top-k of all windows sum to at most 1; a context read in
    # one window scores p_start * p_end, as the forward's probabilities give it.
    top = reader(9.0).answer(context, "Which?", stride=10, top_k=5)
    assert 2 <= len(top) <= 5 and _distinct(top)
    assert 0 < sum(a.score for a in top) <= 1 + 1e-6 and top[0].score > top[1].score
    short = " ".join(text[100:130])
    one = reader(9.0)
    best, probs = one.answer_with_probabilities(short, "Which?")
    assert probs["window"] == (0, probs["n_tokens"])
    assert best.score == pytest.approx(max(probs["p_start"]) * max(probs["p_end"]), rel=1e-5)


def test_lexical_terms_keep_content_words_only():
    assert lexical_terms(["The", "Zorbland", "bridge", ",", "opened", "in", "1937", "--", "U.S."]) == \
        [None, "zorbland", "bridge", None, "opened", None, "1937", None, "us"]


def test_a_long_context_gives_the_answer_of_its_paragraph_alone(reader, qa):
    para = reader["paragraph"]
    context = FILLER + para["context"]
    for q in para["qas"]:
        with _rows_seen(qa.model) as seen:
            res = qa.answer(context, q["question"])
        # Offsets into the whole text. (Which span wins: the windows hold filler the reader never saw, so that is
        # its generalisation, which moves with the seed and the CPU's rounding; read apart, below, the paragraph
        # gives its own answer.)
        assert context[res.start:res.end] == res.text
        # bounded memory: no row longer than the window, and every window was read
        assert max(n for _, n in seen) <= qa.limits.context == 400
        assert sum(b for b, _ in seen) >= 10_000 // (400 - 128)
    # With a blank line before it, the paragraph is a window of its own, read as if it were alone: an answer in it
    # is the paragraph's own. (Whether a filler window's span outranks it -- start + end logits plus the window's
    # relevance -- is the reader's generalisation to text it never saw: it does for some seeds.)
    apart = FILLER + "\n\n" + para["context"]
    for q in para["qas"]:
        alone, res = qa.answer(para["context"], q["question"]), qa.answer(apart, q["question"])
        assert apart[res.start:res.end] == res.text
        if res.start >= len(FILLER) + 2:
            assert (res.text, res.start) == (alone.text, alone.start + len(FILLER) + 2)
    probs = qa.probabilities(context, para["qas"][0]["question"])
    first, end = probs["window"]
    assert (first, end) in plan_windows(probs["n_tokens"], 400, 128)
    assert end > 10_000 and end - first == 400 == len(probs["p_start"]) == len(probs["tokens"])


def test_qa_predict_reads_long_contexts_in_windows(reader, tmp_path, capsys):
    para = reader["paragraph"]
    obj = {"version": "1.1", "data": [{"title": "long", "paragraphs": [
        {"context": FILLER + para["context"],
         "qas": [{**q, "answers": [{**a, "answer_start": a["answer_start"] + len(FILLER)} for a in q["answers"]]}
                 for q in para["qas"]]}]}]}
    data = write_json(tmp_path / "long.json", obj)
    pred = tmp_path / "pred.json"
    rc, _, _ = run_cli(capsys, ["qa-predict", "--model", reader["run"], "--data", data, "--out", pred, "--no-cache",
                                "--no-progress"])
    assert rc == 0
    predictions = json.loads(pred.read_text(encoding="utf-8"))
    # The reader's own answers to the long context, through the Python API.
    qa = QAModel.load(reader["run"])
    assert predictions == {q["id"]: qa.answer(FILLER + para["context"], q["question"]).text for q in para["qas"]}
    assert_user_error(capsys, ["qa-predict", "--model", reader["run"], "--data", data, "--out", pred,
                               "--max-context", "64", "--stride", "64"],
                      r"stride 64 must be smaller than max_context 64")


# ------------------------------------------------------------------------------------------------- top-k

def _brute_top(lp1, lp2, n, max_len, k):
    spans = [(float(lp1[i] + lp2[j]), i, j) for i in range(n) for j in range(i, min(n, i + max_len + 1))]
    return sorted(spans, key=lambda s: -s[0])[:k]


@pytest.mark.parametrize("max_len,k", [(0, 3), (2, 5), (30, 4), (30, 200)])
def test_decode_top_spans_matches_brute_force(max_len, k):
    g = torch.Generator().manual_seed(max_len + k)
    B, n = 4, 17
    lengths = torch.tensor([17, 1, 6, 11])
    mask = torch.arange(n)[None, :] < lengths[:, None]
    lp1 = torch.log_softmax(torch.randn(B, n, generator=g).masked_fill(~mask, -1e30), 1)
    lp2 = torch.log_softmax(torch.randn(B, n, generator=g).masked_fill(~mask, -1e30), 1)
    top = decode_top_spans(lp1, lp2, k, max_answer_len=max_len, lengths=lengths)
    assert top["start"].shape == (B, k)
    for b in range(B):
        want = _brute_top(lp1[b], lp2[b], int(lengths[b]), max_len, k)
        got = [(float(top["log_score"][b, r]), int(top["start"][b, r]), int(top["end"][b, r]))
               for r in range(k) if top["valid"][b, r]]
        assert len(got) == len(want)                          # rows with fewer spans than k say so
        assert [s for s, _, _ in got] == pytest.approx([s for s, _, _ in want], rel=1e-6)
        assert len({(i, j) for _, i, j in got}) == len(got)   # distinct spans
        assert all(0 <= j - i <= max_len and j < lengths[b] for _, i, j in got)
        assert not top["valid"][b, len(got):].any() and (top["score"][b, len(got):] == 0).all()
    best = decode_top_spans(lp1, lp2, 1, max_answer_len=max_len, lengths=lengths)   # a smaller k: the same first
    assert torch.equal(top["start"][:, :1], best["start"]) and torch.equal(top["end"][:, :1], best["end"])
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        decode_top_spans(lp1, lp2, 0)


def _distinct(answers: list[Answer]) -> bool:
    """No two of ``answers`` overlap in the context (and none is there twice)."""
    return all(not (a.start < b.end and b.start < a.end) and (a.start, a.end) != (b.start, b.end)
               for i, a in enumerate(answers) for b in answers[i + 1:])


def test_top_k_answers_python_and_command(reader, qa, capsys):
    para = reader["paragraph"]
    q = para["qas"][1]["question"]
    one = qa.answer(para["context"], q)
    top = qa.answer(para["context"], q, top_k=4)
    # at most k answers: a span overlapping a better one is left out
    assert isinstance(top, list) and 2 <= len(top) <= 4 and all(isinstance(a, Answer) for a in top)
    assert top[0] == one and _distinct(top)
    scores = [a.score for a in top]
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1]
    assert all(para["context"][a.start:a.end] == a.text for a in top)
    assert all(a.no_answer_prob is None and not a.abstained for a in top)
    # the same over windows of a long text, and from the command line
    long = qa.answer(FILLER + para["context"], q, top_k=3)
    assert long[0] == qa.answer(FILLER + para["context"], q) and 1 <= len(long) <= 3 and _distinct(long)
    assert all((FILLER + para["context"])[a.start:a.end] == a.text for a in long)
    top2 = qa.answer(para["context"], q, top_k=2)
    assert 1 <= len(top2) <= 2 and top2 == top[:len(top2)]
    rc, out, _ = run_cli(capsys, ["ask", "--model", reader["run"], "--context", para["context"], "--question", q,
                                  "--top-k", "2"])
    assert rc == 0 and json.loads(out) == {"answer": one.to_dict(), "answers": [a.to_dict() for a in top2]}
    assert set(json.loads(out)["answer"]) == {"text", "start", "end", "score", "no_answer_prob", "abstained"}
    rc, out, _ = run_cli(capsys, ["ask", "--model", reader["run"], "--context", para["context"], "--question", q])
    assert rc == 0 and json.loads(out) == {"answer": one.to_dict(), "answers": [one.to_dict()]}
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, 20\] \(got 0\)"):
        qa.answer(para["context"], q, top_k=0)
    # min_score drops the answers below it; with none left, one answer abstains with the best score
    assert scores[0] > scores[1]
    assert qa.answer(para["context"], q, top_k=4, min_score=scores[-1]) == top
    assert qa.answer(para["context"], q, top_k=4, min_score=scores[0]) == [one]
    assert qa.answer(para["context"], q, min_score=scores[0]) == one
    # Above the best score: one answer that abstains. A memorised answer's score may round to 1.0, the highest
    # min_score, so this asks where the reader's best scores under 1 (a text it never saw among them).
    unseen = "Grace Hopper was born in Leeds in 1906. Later, Grace Hopper played the harp every evening."
    pairs = [(para["context"], qa_["question"]) for qa_ in para["qas"]] + [(unseen, "What did Grace play?")]
    context, question, best = next((c, qq, b) for c, qq in pairs if (b := qa.answer(c, qq)).score < 1.0)
    none = Answer("", 0, 0, best.score, None, abstained=True)
    assert qa.answer(context, question, min_score=1.0) == none
    assert qa.answer(context, question, top_k=4, min_score=1.0) == [none]
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="min_score must be a number in"):
            qa.answer(para["context"], q, min_score=bad)


def test_top_k_of_a_no_answer_reader_ranks_no_answer_among_the_spans(tmp_path):
    from fastqa.cli import main

    make_squad(tmp_path / "v2.json", articles=1, paragraphs=2, people=1, v2=True, seed=3)
    assert main([str(a) for a in _train_args(tmp_path / "v2.json", tmp_path / "run", "--max-steps", "3")]) == 0
    qa = QAModel.load(tmp_path / "run")
    context = "Ada Lovelace was born in Zürich in 1815. Later, Ada Lovelace played the cello every evening."
    for question in ("Where was Ada Lovelace born?", "Where was Émile Zola born?"):
        one = qa.answer(context, question)
        top = qa.answer(context, question, top_k=5)
        assert one.no_answer_prob is not None and 0.0 <= one.no_answer_prob <= 1.0
        assert all(a.no_answer_prob == one.no_answer_prob for a in top)
        assert top[0] == one
        assert [a.text for a in top].count("") <= 1 and 1 <= len(top) <= 5 and _distinct(top)
        scores = [a.score for a in top]
        assert scores == sorted(scores, reverse=True)


# ---------------------------------------------------------------------------------------- JSON-lines batches

def test_ask_input_jsonl_batches(reader, qa, tmp_path, capsys):
    paras = [p for a in reader["plain"]["data"] for p in a["paragraphs"]][:3]
    records = [{"id": q["id"], "context": p["context"], "question": q["question"]} for p in paras for q in p["qas"][:3]]
    records[4].pop("id")                                   # no id: the line number stands for it
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    lines.insert(2, "")                                    # blank lines are skipped (and still counted)
    src = tmp_path / "q.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # (the batch size is the same as the command's: padding moves a tiny reader's scores a little)
    want = qa.answer_many([r["context"] for r in records], [r["question"] for r in records], batch_size=2)
    rc, out, _ = run_cli(capsys, ["ask", "--model", reader["run"], "--input", src, "--batch-size", "2"])
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and len(rows) == len(records)
    assert [r["id"] for r in rows] == [r.get("id", 6) for r in records]     # record 4 sits on line 6
    assert [{k: v for k, v in r.items() if k != "id"} for r in rows] == \
        [{"answer": a.to_dict(), "answers": [a.to_dict()]} for a in want]
    dest = tmp_path / "a.jsonl"
    rc, out, err = run_cli(capsys, ["ask", "--model", reader["run"], "--input", src, "--output", dest, "--top-k", "2",
                                    "--batch-size", "2"])
    assert rc == 0 and out == "" and f"{len(records)} answers written" in err
    rows = [json.loads(line) for line in dest.read_text(encoding="utf-8").splitlines()]
    want2 = qa.answer_many([r["context"] for r in records], [r["question"] for r in records], batch_size=2, top_k=2)
    assert all(1 <= len(w) <= 2 for w in want2) and sum(len(w) for w in want2) > len(records)
    assert [r["answers"] for r in rows] == [[a.to_dict() for a in w] for w in want2]
    assert [r["answers"][0] for r in rows] == [r["answer"] for r in rows] == [a.to_dict() for a in want]


@pytest.mark.parametrize("line,message", [
    ('{"id": "a", "context": "Some text.", "question": }', r"q\.jsonl: line 2: malformed JSON at column"),
    ('["a", "b"]', r"q\.jsonl: line 2: expected a JSON object"),
    ('{"id": "a", "context": "Some text."}', r"q\.jsonl: line 2: 'question' must be a string \(missing\)"),
    ('{"id": "a", "context": "  ", "question": "Who?"}', r"q\.jsonl: line 2: the context is empty"),
    ('{"id": true, "context": "Text.", "question": "Who?"}', r"q\.jsonl: line 2: 'id' must be a string or an integer"),
    ('{"context": "caf\\udce9", "question": "Who?"}', r"q\.jsonl: line 2: the context is not valid Unicode text"),
])
def test_a_bad_input_line_is_one_error_naming_file_and_line(reader, tmp_path, capsys, line, message):
    src = tmp_path / "q.jsonl"
    src.write_text('{"id": "ok", "context": "Some text.", "question": "What?"}\n' + line + "\n", encoding="utf-8")
    assert_user_error(capsys, ["ask", "--model", reader["run"], "--input", src], message)


def test_ask_flag_combinations_are_checked(reader, tmp_path, capsys):
    src = tmp_path / "q.jsonl"
    src.write_text('{"context": "Some text.", "question": "What?"}\n', encoding="utf-8")
    assert_user_error(capsys, ["ask", "--model", reader["run"], "--input", src, "--question", "Q?"],
                      r"--question: the questions come from --input")
    assert_user_error(capsys, ["ask", "--model", reader["run"], "--input", src, "--plot", tmp_path / "p.png"],
                      r"--plot draws one question")
    assert_user_error(capsys, ["ask", "--model", reader["run"], "--context", "Text."], r"--question is required")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert_user_error(capsys, ["ask", "--model", reader["run"], "--input", empty], r"empty\.jsonl: no questions")


# ------------------------------------------------------------------------------------------------ the figure

def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_plot_stays_legible_on_a_long_context(reader, tmp_path, capsys):
    para = reader["paragraph"]
    q = para["qas"][0]
    context = " ".join(random.Random(1).choice(LOREM) for _ in range(1_000)) + " " + para["context"] + " " + \
        " ".join(random.Random(2).choice(LOREM) for _ in range(1_000))
    short_png, long_png = tmp_path / "short.png", tmp_path / "long.png"
    for ctx, png in ((para["context"], short_png), (context, long_png)):
        rc, out, _ = run_cli(capsys, ["ask", "--model", reader["run"], "--context", ctx, "--question", q["question"],
                                      "--plot", png])
        assert rc == 0 and json.loads(out)["plot"] == str(png)
    width, height = _png_size(long_png)
    assert width <= 1800 and height <= 600          # ~90 tokens drawn, not 2,000 (a 2,000-token figure: 440 in)
    assert _png_size(short_png)[0] <= width
    pdf = tmp_path / "long.pdf"
    rc, _, _ = run_cli(capsys, ["ask", "--model", reader["run"], "--context", context, "--question", q["question"],
                                "--plot", pdf])
    assert rc == 0 and pdf.read_bytes()[:4] == b"%PDF"
    svg = tmp_path / "long.svg"
    rc, _, _ = run_cli(capsys, ["ask", "--model", reader["run"], "--context", context, "--question", q["question"],
                                "--plot", svg, "--top-k", "2"])
    assert rc == 0 and b"<svg" in svg.read_bytes()[:1000]
    # the format is checked before the model is read: an unknown suffix costs nothing
    assert_user_error(capsys, ["ask", "--model", tmp_path / "nothing", "--context", "Text.", "--question", "Q?",
                               "--plot", tmp_path / "p.foo"], r"--plot .*p\.foo: unknown figure format '\.foo'")
    assert not list(tmp_path.glob(".*.tmp"))


def test_plot_labels_and_hidden_token_note(reader, qa, tmp_path):
    from fastqa.plots import plot_span_probabilities

    para = reader["paragraph"]
    q = para["qas"][0]["question"]
    context = ". " * 2_000 + para["context"]
    fig = plot_span_probabilities(qa.probabilities(context, q), qa.answer(context, q), q, str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    ax = fig.axes[0]
    assert ax.get_ylabel() == "probability" and ax.get_xlabel().startswith("context token")
    assert len(ax.get_xticks()) <= 2 * 40 + 31 + 1
    assert all(line.get_marker() not in (None, "None", "") for line in ax.get_lines())
    texts = [t.get_text() for t in fig.texts]
    assert any("tokens not shown" in t for t in texts)
    assert fig.get_suptitle().count(q[:20]) == 1 and q[:20] not in ax.get_title()
    assert fig.get_size_inches()[0] <= 18


# ------------------------------------------------------------------------------------------ shipped models

@pytest.fixture()
def shipped(reader, tmp_path, monkeypatch):
    """A package folder of shipped models holding the tiny reader as "qanet-small-squad"."""
    from fastqa.export import export_run

    export_run(reader["run"], tmp_path / "qanet-small-squad", half=True)
    monkeypatch.setattr(pretrained, "FOLDER", tmp_path)
    return tmp_path


def test_resolve_names_and_paths(shipped, tmp_path, monkeypatch):
    assert pretrained.resolve("qanet-small-squad") == shipped / "qanet-small-squad"
    assert pretrained.available() == ["qanet-small-squad"]
    with pytest.raises(UserError, match=r"'convs2s-small-multi30k' is not installed .*known: qanet-small-squad, "
                                         r"convs2s-small-multi30k"):
        pretrained.resolve("convs2s-small-multi30k")
    with pytest.raises(UserError, match=r"'qanet-tiny': no such file or folder, and not a shipped model \(known: "):
        pretrained.resolve("qanet-tiny")
    missing = tmp_path / "runs" / "gone"
    assert pretrained.resolve(str(missing)) == missing        # a path: its loader names what is missing
    # a folder that exists wins over the name (a run trained into ./qanet-small-squad is read as that run)
    here = tmp_path / "work"
    (here / "qanet-small-squad").mkdir(parents=True)
    monkeypatch.chdir(here)
    assert pretrained.resolve("qanet-small-squad").resolve() == here / "qanet-small-squad"


def test_the_shipped_reader_is_the_default(reader, shipped, capsys):
    para = reader["paragraph"]
    q = para["qas"][0]
    default = QAModel.load()
    by_name = QAModel.load("qanet-small-squad")
    assert default.answer(para["context"], q["question"]) == by_name.answer(para["context"], q["question"])
    run = QAModel.load(reader["run"]).answer(para["context"], q["question"])
    res = default.answer(para["context"], q["question"])
    assert res.text == run.text == q["answers"][0]["text"]
    assert res.score == pytest.approx(run.score, abs=1e-2)
    rc, out, _ = run_cli(capsys, ["ask", "--context", para["context"], "--question", q["question"]])
    assert rc == 0 and json.loads(out) == {"answer": res.to_dict(), "answers": [res.to_dict()]}


def test_a_missing_shipped_reader_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pretrained, "FOLDER", tmp_path)
    with pytest.raises(UserError, match=r"shipped model 'qanet-small-squad' is not installed"):
        QAModel.load()
    assert_user_error(capsys, ["ask", "--context", "Text.", "--question", "Q?"],
                      r"'qanet-small-squad' is not installed .*--model DIR")


def test_scores_are_probabilities(qa, reader):
    para = reader["paragraph"]
    res = qa.answer(FILLER + para["context"], para["qas"][0]["question"], top_k=3)
    assert 1 <= len(res) <= 3 and all(0.0 < a.score <= 1.0 and math.isfinite(a.score) for a in res)
