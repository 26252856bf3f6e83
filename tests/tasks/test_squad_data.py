"""SQuAD loading (offsets, answer spans, errors), training limits, caching, vocabularies, word vectors."""
import gzip
import json
import logging
import os

import pytest
import torch
from squad_fixtures import make_squad, write_json

from fastqa.tasks.qa import squad as squad_mod
from fastqa.tasks.qa.squad import (NO_TARGET, Limits, build_vocabs, collate, encode_squad, load_squad, parse_articles,
                               read_squad)
from fastqa.data.vectors import read_vectors, vectors_for_vocab
from fastqa.data.vocab import Vocab
from fastqa.errors import UserError


def test_offsets_and_answer_spans_are_exact(tmp_path):
    obj = make_squad(tmp_path / "d.json", articles=3, paragraphs=4, v2=True)
    data = load_squad(tmp_path / "d.json", progress=False)
    n_questions = sum(len(p["qas"]) for a in obj["data"] for p in a["paragraphs"])
    assert len(data.questions) == n_questions and len(data.contexts) == 12 and data.v2
    for c in data.contexts:
        for tok, (s, e) in zip(c.tokens, c.offsets):
            assert c.text[s:e] == tok and tok.strip() == tok and tok  # no whitespace tokens (\xa0, \u2009, \t)
    checked = 0
    for q in data.questions:
        c = data.contexts[q.context]
        if q.is_impossible:
            assert q.spans == [] and q.answers == []
            continue
        assert len(q.spans) == len(q.answers)
        for (first, last), text in zip(q.spans, q.answers):
            assert c.text[c.offsets[first][0]:c.offsets[last][1]] == text
            checked += 1
    assert checked > 100 and sum(q.is_impossible for q in data.questions) == 12
    assert any("\u00a0" in c.text or "\u2009" in c.text for c in data.contexts)


def test_gzip_equals_plain_and_article_selection(tmp_path):
    obj = make_squad(tmp_path / "d.json", articles=5, paragraphs=2)
    write_json(tmp_path / "d.json.gz", obj)
    plain = load_squad(tmp_path / "d.json", "1:3", progress=False)
    gz = load_squad(tmp_path / "d.json.gz", "1:3", progress=False)
    assert [q.qid for q in plain.questions] == [q.qid for q in gz.questions]
    assert plain.articles == (1, 3) and {c.article for c in plain.contexts} == {1, 2}
    assert [a["title"] for a in plain.dataset["data"]] == [obj["data"][1]["title"], obj["data"][2]["title"]]
    assert parse_articles("3:", 5) == (3, 5) and parse_articles(":2", 5) == (0, 2) and parse_articles("4", 5) == (4, 5)
    assert parse_articles(None, 5) == (0, 5)
    for bad in ("0:6", "3:3", "a:b", "-1:2"):
        with pytest.raises(UserError, match="articles"):
            parse_articles(bad, 5)


def test_mismatched_answer_is_counted_not_refound(tmp_path, caplog):
    obj = make_squad(articles=1, paragraphs=1, people=1)
    para = obj["data"][0]["paragraphs"][0]
    qa = para["qas"][0]  # "Where was X born?" -> the city
    city = qa["answers"][0]["text"]
    qa["answers"][0]["answer_start"] += 1                 # off by one: the text is elsewhere in the context
    qa["answers"].append({"text": city, "answer_start": para["context"].index(city)})  # a good second answer
    bad_only = para["qas"][1]
    bad_only["answers"] = [{"text": "Nowhere", "answer_start": 0}]
    write_json(tmp_path / "m.json", obj)
    with caplog.at_level(logging.WARNING, logger="fastqa.data"):
        data = load_squad(tmp_path / "m.json", progress=False)
    assert [(m[0], m[1]) for m in data.mismatched] == [(qa["id"], city), (bad_only["id"], "Nowhere")]
    assert "2 answers' text differs from the context at answer_start" in caplog.text and qa["id"] in caplog.text
    by_id = {q.qid: q for q in data.questions}
    assert len(by_id[qa["id"]].spans) == 1             # only the matching answer, never searched for
    assert by_id[bad_only["id"]].spans == []
    assert by_id[bad_only["id"]].answers == ["Nowhere"]  # still a gold answer for the metric
    words, chars = build_vocabs(data)
    train = encode_squad(data, words, chars, train=True)
    assert train.dropped["no matching answer"] == 1 and len(train) == len(data.questions) - 1
    dev = encode_squad(data, words, chars, train=False)
    assert len(dev) == len(data.questions)
    assert dev.starts[data.questions.index(by_id[bad_only["id"]])] == NO_TARGET


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_read_errors_name_file_position_and_question(tmp_path):
    with pytest.raises(UserError, match="nope.json: no such file"):
        load_squad(tmp_path / "nope.json", progress=False)
    bad = _write(tmp_path, "bad.json", '{"version": "1.1",\n "data": [\n  {"title": "x",, }]}')
    with pytest.raises(UserError, match=r"bad.json: malformed JSON at line 3, column 17"):
        read_squad(bad)
    gz = tmp_path / "bad.json.gz"
    gz.write_bytes(gzip.compress(b'{"data": [\n\n]]'))
    with pytest.raises(UserError, match=r"bad.json.gz: malformed JSON at line 3, column 2"):
        read_squad(gz)
    obj = make_squad(articles=1, paragraphs=1, people=1)
    qa = obj["data"][0]["paragraphs"][0]["qas"][2]
    qa["answers"][0]["answer_start"] = 10_000
    p = write_json(tmp_path / "range.json", obj)
    with pytest.raises(UserError, match=f"question '{qa['id']}', answer 0: answer_start 10000 .* out of range"):
        read_squad(p)
    qa["answers"][0]["answer_start"] = -1
    with pytest.raises(UserError, match=f"question '{qa['id']}'.*out of range"):
        read_squad(write_json(tmp_path / "neg.json", obj))
    qa["answers"][0]["answer_start"] = "7"
    with pytest.raises(UserError, match="'answer_start' must be of type int, got str"):
        read_squad(write_json(tmp_path / "str.json", obj))
    del obj["data"][0]["paragraphs"][0]["context"]
    with pytest.raises(UserError, match="article 0, paragraph 0: missing 'context'"):
        read_squad(write_json(tmp_path / "nocontext.json", obj))
    with pytest.raises(UserError, match="not a SQuAD file"):
        read_squad(_write(tmp_path, "list.json", "[1, 2]"))


def test_training_limits_apply_to_training_only(tmp_path):
    long_word = "Supercalifragilisticexpialidocious"
    filler = " ".join(f"w{i}" for i in range(500))
    context = f"{long_word} is early. {filler} The late answer is here."
    question = "Which " + " ".join(["very"] * 60) + " word?"
    late = context.index("late answer")
    qas = [
        {"id": "early", "question": question, "answers": [{"text": long_word, "answer_start": 0}]},
        {"id": "late", "question": "Where?", "answers": [{"text": "late answer", "answer_start": late}]},
        {"id": "long", "question": "Long?", "answers": [{"text": "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 "
                                                                 "w14 w15 w16 w17 w18 w19 w20 w21 w22 w23 w24 w25 "
                                                                 "w26 w27 w28 w29 w30 w31", "answer_start": context.index("w0")}]},
    ]
    obj = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    data = load_squad(write_json(tmp_path / "lim.json", obj), progress=False)
    words, chars = build_vocabs(data)
    train = encode_squad(data, words, chars, train=True)
    assert train.dropped == {"no matching answer": 0, "unanswerable": 0, "answer beyond context limit": 1,
                             "answer too long": 1}
    assert len(train) == 1
    assert train.ctx_words[0].shape == (400,) and train.ctx_chars[0].shape == (400, 16)
    assert train.q_words[0].shape == (50,) and train.starts == [0] and train.ends == [0]
    full = len(data.contexts[0].tokens)
    dev = encode_squad(data, words, chars, train=False)
    assert len(dev) == 3 and dev.ctx_words[0].shape == (full,) and full > 500
    # words are cut to the character window in evaluation too (what the char CNN was trained on)
    assert dev.ctx_chars[0].shape[1] == 16 < len(long_word) and dev.q_words[0].shape == (len(data.questions[0].tokens),)
    assert dev.starts[1] == data.questions[1].spans[0][0] > 400
    assert dev.ends[2] - dev.starts[2] == 31  # 32 tokens: too long to train on, kept for evaluation


def test_no_answer_targets(tmp_path):
    data = load_squad(make_squad(tmp_path / "v2.json", articles=1, paragraphs=3, v2=True) and tmp_path / "v2.json",
                      progress=False)
    words, chars = build_vocabs(data)
    with_null = encode_squad(data, words, chars, train=True, no_answer=True)
    without = encode_squad(data, words, chars, train=True, no_answer=False)
    assert len(with_null) == len(data.questions) and without.dropped["unanswerable"] == 3
    for i, qi in enumerate(with_null.examples):
        q = data.questions[qi]
        if q.is_impossible:
            assert (with_null.starts[i], with_null.ends[i]) == (0, 0)
        else:  # token t is output position t + 1
            assert (with_null.starts[i], with_null.ends[i]) == (q.spans[0][0] + 1, q.spans[0][1] + 1)


def test_collate_pads_words_and_chars(tmp_path):
    data = load_squad(make_squad(tmp_path / "d.json", articles=1, paragraphs=4) and tmp_path / "d.json",
                      progress=False)
    words, chars = build_vocabs(data)
    enc = encode_squad(data, words, chars, train=True)
    idx = [0, 5, 9]
    b = collate(enc, idx)
    n = max(len(enc.ctx_words[enc.example_ctx[i]]) for i in idx)
    assert b.context_words.shape == (3, n) and b.context_chars.shape[:2] == (3, n)
    for row, i in enumerate(idx):
        cw = enc.ctx_words[enc.example_ctx[i]]
        assert torch.equal(b.context_words[row, :len(cw)], cw)
        assert (b.context_words[row, len(cw):] == words.pad_id).all()
        cc = enc.ctx_chars[enc.example_ctx[i]]
        assert torch.equal(b.context_chars[row, :cc.shape[0], :cc.shape[1]], cc)
        assert int(b.starts[row]) == enc.starts[i]
    # a token's chars decode back to the token
    q = data.questions[enc.examples[idx[0]]]
    tok = data.contexts[q.context].tokens[2]
    ids = [int(x) for x in b.context_chars[0, 2] if int(x) != chars.pad_id]
    assert "".join(chars.decode(ids)) == tok
    # length-bucketed batches cover every example once
    batches = enc.batches(8, seed=3, epoch=1)
    assert sorted(i for bt in batches for i in bt) == list(range(len(enc)))
    assert batches == enc.batches(8, seed=3, epoch=1) != enc.batches(8, seed=3, epoch=2)


def test_cache_key_follows_file_content_and_settings(tmp_path, monkeypatch):
    path = tmp_path / "d.json"
    cache = tmp_path / "cache"
    make_squad(path, articles=2, paragraphs=2, seed=1)
    first = load_squad(path, cache_dir=cache, progress=False)
    tok_files = list(cache.glob("*.tok.pt"))
    assert len(tok_files) == 1 and not list(cache.glob(".*tmp"))  # atomic: no temporary file left

    def no_tokenizing(*a, **k):
        raise AssertionError("tokenised again despite the cache")

    monkeypatch.setattr(squad_mod, "tokenize", no_tokenizing)
    again = load_squad(path, cache_dir=cache, progress=False)
    assert [q.qid for q in again.questions] == [q.qid for q in first.questions]
    monkeypatch.undo()
    # another article selection and another file content are new keys
    load_squad(path, "0:1", cache_dir=cache, progress=False)
    make_squad(path, articles=2, paragraphs=2, seed=2)       # same path, new content
    changed = load_squad(path, cache_dir=cache, progress=False)
    assert [q.qid for q in changed.questions] != [q.qid for q in first.questions]
    assert len(list(cache.glob("*.tok.pt"))) == 3
    words, chars = build_vocabs(changed)
    encode_squad(changed, words, chars, train=True, cache_dir=cache)
    encode_squad(changed, words, chars, train=True, cache_dir=cache)            # hit
    encode_squad(changed, words, chars, train=True, limits=Limits(context=20), cache_dir=cache)
    encode_squad(changed, words, chars, train=False, cache_dir=cache)
    encode_squad(changed, Vocab.build([["x"]]), chars, train=False, cache_dir=cache)
    assert len(list(cache.glob("*.enc.pt"))) == 4


def test_vocab_with_vectors_keeps_words_that_have_one(tmp_path):
    data = load_squad(make_squad(tmp_path / "d.json", articles=1, paragraphs=2) and tmp_path / "d.json",
                      progress=False)
    other = load_squad(make_squad(tmp_path / "e.json", articles=1, paragraphs=2, seed=5) and tmp_path / "e.json",
                       progress=False)
    known = {"born", "was", "in", "evening"}
    words, chars = build_vocabs(data, others=[other], has_vector=lambda t: t.lower() in known)
    assert words.itos[:2] == ["<pad>", "<unk>"] and {w.lower() for w in words.itos[2:]} == known
    assert "In" in words  # cased tokens stay distinct; their vector lookup falls back to lowercase
    plain, _ = build_vocabs(data)
    assert set(plain.itos) >= {t for c in data.contexts for t in c.tokens}
    train_chars = {ch for tokens in [*(c.tokens for c in data.contexts), *(q.tokens for q in data.questions)]
                   for t in tokens for ch in t}
    assert set(chars.itos[2:]) == train_chars  # characters come from the training text only


def test_read_vectors_formats(tmp_path, caplog):
    glove = _write(tmp_path, "g.txt", "the 0.1 0.2 0.3\nNew York 1 2 3\ncafé -1 -2 -3.5e-1\n")
    vec, dim = read_vectors(glove)
    assert dim == 3 and set(vec) == {"the", "New York", "café"}
    assert torch.equal(vec["café"], torch.tensor([-1.0, -2.0, -0.35]))
    fasttext = tmp_path / "f.vec.gz"
    fasttext.write_bytes(gzip.compress("2 3\nthe 0.1 0.2 0.3 \nx 1 1 1\n".encode()))
    vec2, dim2 = read_vectors(fasttext, words={"the"})
    assert dim2 == 3 and list(vec2) == ["the"] and torch.allclose(vec2["the"], vec["the"])
    with pytest.raises(UserError, match=r"bad.txt: line 2: 2 values, expected 3"):
        read_vectors(_write(tmp_path, "bad.txt", "a 1 2 3\nb 1 2\n"))
    with pytest.raises(UserError, match=r"nan.txt: line 2: a vector value is not a number"):
        read_vectors(_write(tmp_path, "nan.txt", "a 1 2 3\nb 1 x 3\n"))
    with pytest.raises(UserError, match="no such vectors file"):
        read_vectors(tmp_path / "missing.txt")
    words = Vocab.build([["The", "café", "unseen"]])
    with caplog.at_level(logging.INFO, logger="fastqa.data"):
        matrix, found = vectors_for_vocab(words, vec, dim, seed=0)
    assert found == 2 and "2 of 5 vocabulary words found" in caplog.text
    assert torch.equal(matrix[words["The"]], vec["the"])     # lowercase fallback (GloVe 6B is lowercased)
    assert torch.equal(matrix[words.pad_id], torch.zeros(3))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastqa.data"):
        rand, found = vectors_for_vocab(words, None, 4, seed=0)
    assert found == 0 and rand.shape == (5, 4) and "random vectors" in caplog.text
    assert torch.equal(rand, vectors_for_vocab(words, None, 4, seed=0)[0])


def test_answers_optional_for_prediction(tmp_path):
    obj = make_squad(articles=1, paragraphs=1, people=1)
    for qa in obj["data"][0]["paragraphs"][0]["qas"]:
        del qa["answers"]
    data = load_squad(write_json(tmp_path / "test.json", obj), progress=False)
    assert all(q.answers == [] and q.spans == [] for q in data.questions)
    assert os.path.exists(tmp_path / "test.json") and json.loads((tmp_path / "test.json").read_text())
