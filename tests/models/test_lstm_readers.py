"""The attention tutorial's recurrent QA baselines (lstm, lstm-attention, lstm-pointer) in the QA pipeline:
the readers' outputs, packing, targets, training through ``qa-train --model``, answers that are always
context words, a pointer that never leaves the context, ``ask``, and their user errors."""
import json

import pytest
import torch
from cli_helpers import assert_user_error, run_cli
from helpers import SEED_ARGS
from squad_fixtures import make_squad

from fastqa.tasks.qa.squad import NO_TARGET, Limits, build_vocabs, encode_squad, load_squad
from fastqa.data.tokenize import tokenize
from fastqa.models.lstm_readers import VARIANTS, LSTMReader, LSTMReaderConfig
from fastqa.tasks.qa import QAModel, decode_top_spans

PAD, UNK, V = 0, 1, 40


def _reader(variant, *, no_answer=False, pointer_span=True, seed=0):
    torch.manual_seed(seed)
    config = LSTMReaderConfig.from_preset("small", variant=variant, word_vocab_size=V, word_dim=8, hidden_dim=12,
                                          no_answer=no_answer, pointer_span=pointer_span)
    return LSTMReader(config).eval()


def _batch(seed=0, *, unk_every=0):
    """Context [4, 9] and question [4, 5] word ids with ragged lengths (and <unk> at every unk_every-th place)."""
    g = torch.Generator().manual_seed(seed)
    cw = torch.randint(2, V, (4, 9), generator=g)
    qw = torch.randint(2, V, (4, 5), generator=g)
    for row, (n, m) in enumerate([(9, 5), (3, 2), (6, 5), (1, 1)]):
        cw[row, n:] = PAD
        qw[row, m:] = PAD
    if unk_every:
        cw[:, ::unk_every] = torch.where(cw[:, ::unk_every] == PAD, PAD, UNK)
    chars = lambda w: torch.zeros(*w.shape, 3, dtype=torch.long)  # noqa: E731 - not read by the readers
    return cw, chars(cw), qw, chars(qw)


ALL = [(v, na, span) for v in VARIANTS for na in (False, True) for span in ((True, False) if v == "lstm-pointer" else (True,))]


@pytest.mark.parametrize("variant,no_answer,span", ALL)
def test_outputs_cover_only_answerable_context_positions(variant, no_answer, span):
    model = _reader(variant, no_answer=no_answer, pointer_span=span)
    cw, cc, qw, qc = _batch(unk_every=3)
    lp1, lp2 = model(cw, cc, qw, qc)
    shift = int(no_answer)
    assert lp1.shape == lp2.shape == (4, 9 + shift)
    assert torch.isfinite(lp1).all() and torch.isfinite(lp2).all()
    can = cw != PAD
    if variant != "lstm-pointer":
        can &= cw != UNK                                  # a vocabulary reader never answers <unk> (or <pad>)
    p1 = lp1.exp()
    assert (p1[:, shift:][~can] == 0).all() and (p1[:, shift:][can] > 0).all()
    if variant == "lstm-pointer":                         # a distribution over the context (and "no answer")
        torch.testing.assert_close(p1.sum(1), torch.ones(4))
    else:                                                 # the context words' share of the vocabulary
        assert (p1.sum(1) < 1).all()
    if model.config.single_word:                          # the end is the start: log 1 where an answer can be
        assert (lp2[:, shift:][can] == 0).all() and (lp2[:, shift:][~can].exp() == 0).all()
    else:
        torch.testing.assert_close(lp2.exp().sum(1), torch.ones(4))


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_example_reads_the_same_alone_and_in_a_padded_batch(variant):
    # Packing: no padding between an example's question and its context, so batch-mates change nothing.
    model = _reader(variant, no_answer=True)
    cw, cc, qw, qc = _batch(seed=3)
    lp1, lp2 = model(cw, cc, qw, qc)
    for row in range(4):
        n, m = int((cw[row] != PAD).sum()), int((qw[row] != PAD).sum())
        a1, a2 = model(cw[row:row + 1, :n], cc[row:row + 1, :n], qw[row:row + 1, :m], qc[row:row + 1, :m])
        torch.testing.assert_close(a1[0], lp1[row, :1 + n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a2[0], lp2[row, :1 + n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant,span", [("lstm-pointer", True), ("lstm-pointer", False)])
def test_the_pointer_never_points_outside_the_context(variant, span):
    # Make the question and <SEP> as attractive as they can be: if the pointer could reach them it would.
    for seed in range(5):
        model = _reader(variant, no_answer=False, pointer_span=span, seed=seed)
        cw, cc, qw, qc = _batch(seed=seed)
        with torch.no_grad():
            model.sep_vector.mul_(50)
        lp1, lp2 = model(cw, cc, qw, qc)
        spans = {k: v[:, 0] for k, v in decode_top_spans(lp1, lp2, 1, max_answer_len=30 if span else 0).items()
                 if v.dim() == 2}
        lengths = (cw != PAD).sum(1)
        assert ((spans["start"] >= 0) & (spans["start"] <= spans["end"]) & (spans["end"] < lengths)).all()
        if not span:
            assert torch.equal(spans["start"], spans["end"])


def test_training_targets():
    cw = torch.tensor([[5, UNK, 7, PAD], [UNK, 6, 8, 9]])
    starts, ends = torch.tensor([1, 2]), torch.tensor([2, 3])
    # vocabulary reader: a gold word it has no entry for is no target; single word: no end target
    s, e = _reader("lstm").training_targets(cw, starts, ends)
    assert s.tolist() == [NO_TARGET, 2] and e.tolist() == [NO_TARGET, NO_TARGET]
    # with "no answer" at index 0 (token t at t + 1): 0 stays the no-answer target
    s, _ = _reader("lstm-attention", no_answer=True).training_targets(cw, torch.tensor([0, 1]), ends)
    assert s.tolist() == [0, NO_TARGET]
    # a span pointer learns both ends, <unk> included (it points at positions, not words)
    s, e = _reader("lstm-pointer").training_targets(cw, starts, ends)
    assert s.tolist() == [1, 2] and e.tolist() == [2, 3]
    _, e = _reader("lstm-pointer", pointer_span=False).training_targets(cw, starts, ends)
    assert e.tolist() == [NO_TARGET, NO_TARGET]


def test_single_word_answers_option_keeps_one_token_answers_only(tmp_path):
    obj = make_squad(tmp_path / "t.json", articles=2, paragraphs=3, seed=4)
    data = load_squad(tmp_path / "t.json")
    words, chars = build_vocabs(data)
    one_token = sum(1 for q in data.questions if q.spans and q.spans[0][0] == q.spans[0][1])
    enc = encode_squad(data, words, chars, train=True, limits=Limits(answer=0))
    assert len(enc) == one_token and 0 < one_token < sum(len(p["qas"]) for a in obj["data"] for p in a["paragraphs"])
    assert all(s == e for s, e in zip(enc.starts, enc.ends))
    assert enc.dropped["answer too long"] == len(data.questions) - one_token
    with pytest.raises(ValueError, match="Limits.answer must be an int >= 0"):
        Limits(answer=-1)


# ------------------------------------------------------------------------------------ the pipeline, end to end

# 64-d words: the tied output layer of the vocabulary readers learns much faster than at 16 or 32 dims.
TINY = ["--set", "word_dim=64", "--set", "hidden_dim=64", "--set", "dropout=0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lstm")
    train = make_squad(root / "train.json", articles=2, paragraphs=6, people=2, seed=21)
    make_squad(root / "dev.json", articles=1, paragraphs=2, people=2, seed=22)
    return {"root": root, "train": root / "train.json", "train_obj": train, "dev": root / "dev.json",
            "cache": root / "cache"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_baseline_trains_and_answers_with_context_words(variant, data, capsys):
    root, out = data["root"], data["root"] / variant
    rc, _, err = run_cli(capsys, ["qa-train", "--model", variant, "--train", data["train"], "--dev", data["dev"],
                                  "--out", out, "--cache-dir", data["cache"], "--no-progress", "--threads", "1",
                                  "--lr", "1e-2", "--warmup", "10", "--batch-size", "16", "--max-steps", "300",
                                  "--eval-every", "0", "--log-every", "25", *TINY, *SEED_ARGS])
    assert rc == 0, err
    assert f"qa-train: {variant}," in err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    # It learns: the vocabulary readers' loss falls by about 15% in these 300 steps, and the CPU's GEMM rounding
    # moves that by a point or two from one processor to another; a reader that learned nothing stays within noise.
    assert len(losses) == 12 and sum(losses[-3:]) < 0.9 * sum(losses[:3]), losses
    assert {"EM", "F1", "dev_loss"} <= set(rows[-1])

    # qa-predict + qa-eval: every answer is a context word (single-word readers) or a slice of the context
    pred = root / f"{variant}-pred.json"
    rc, _, err = run_cli(capsys, ["qa-predict", "--model", out, "--data", data["train"], "--out", pred,
                                  "--no-progress", "--cache-dir", data["cache"]])
    assert rc == 0, err
    predictions = json.loads(pred.read_text(encoding="utf-8"))
    contexts = {qa["id"]: p["context"] for a in data["train_obj"]["data"] for p in a["paragraphs"] for qa in p["qas"]}
    assert len(predictions) == len(contexts)
    single_word = variant != "lstm-pointer"
    for qid, text in predictions.items():
        tokens = [t for t, _ in tokenize(contexts[qid])]
        assert (text in tokens) if single_word else (text and text in contexts[qid]), (qid, text)
    rc, stdout, _ = run_cli(capsys, ["qa-eval", data["train"], pred])
    assert rc == 0 and json.loads(stdout)["f1"] > 0

    # ask, with the picture
    para = data["train_obj"]["data"][0]["paragraphs"][1]
    png = root / f"{variant}.png"
    rc, stdout, err = run_cli(capsys, ["ask", "--model", out, "--context", para["context"],
                                       "--question", para["qas"][0]["question"], "--plot", png])
    printed = json.loads(stdout)
    res = printed["answer"]
    assert rc == 0 and res["text"] == para["context"][res["start"]:res["end"]] and 0 < res["score"] <= 1, err
    assert printed["answers"] == [res] and res["no_answer_prob"] is None and res["abstained"] is False
    if single_word:
        assert res["text"] in [t for t, _ in tokenize(para["context"])]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_user_error(capsys, ["ask", "--model", out, "--context", "x y", "--question", "z?", "--layers", "naive"],
                      rf"--layers chooses QANet's layers; the {variant} reader .* has none")


def test_a_vocabulary_reader_never_answers_an_unknown_word(data, capsys):
    rc, _, err = run_cli(capsys, ["qa-train", "--model", "lstm", "--train", data["train"], "--dev", data["dev"],
                                  "--out", data["root"] / "unk", "--cache-dir", data["cache"], "--no-progress",
                                  "--threads", "1", "--max-steps", "2", "--eval-every", "0", "--single-word-answers",
                                  *TINY, *SEED_ARGS])
    assert rc == 0, err
    one_token = sum(1 for a in data["train_obj"]["data"] for p in a["paragraphs"] for q in p["qas"]
                    if " " not in q["answers"][0]["text"])   # the generated answers are one token unless spaced
    assert f"qa-train: lstm, {one_token} training questions" in err and one_token < 96
    qa = QAModel.load(data["root"] / "unk")
    known = next(w for w in qa.words.itos[2:] if w.isalpha())
    context = f"qwxz vbnm {known} plkjh zzyq."                      # every other word is out of the vocabulary
    for question in ("Who played?", "qwxz?", "What is zzyq?"):
        assert qa.answer(context, question).text in (known, ".")


def test_baseline_user_errors(data, capsys, tmp_path):
    base = ["qa-train", "--train", data["train"], "--dev", data["dev"], "--out", tmp_path / "o", "--cache-dir",
            data["cache"], "--no-progress", "--max-steps", "1"]
    assert_user_error(capsys, [*base, "--model", "lstm", "--layers", "naive"],
                      r"--layers chooses QANet's layers; the lstm reader has none")
    assert_user_error(capsys, [*base, "--model", "lstm-pointer", "--preset", "paper"],
                      r"unknown LSTM reader preset 'paper'; known: small, base")
    assert_user_error(capsys, [*base, "--model", "lstm", "--set", "hidden_dim=0"], r"hidden_dim must be an int >= 1")
    assert_user_error(capsys, [*base, "--model", "qanet", "--preset", "base"], r"unknown QANet preset 'base'")
    with pytest.raises(SystemExit):
        run_cli(capsys, [*base, "--model", "gru"])


def test_benchmark_case_times_qanet_beside_the_baselines():
    from benchmarks.cases_readers import READERS_CASES
    from benchmarks.registry import max_abs_err
    from benchmarks.report import markdown

    case = next(c for c in READERS_CASES if c.quick)
    prepared = case.prepare("fwd+bwd", torch.device("cpu"), torch.float32, compile=False, naive_limit_bytes=0)
    assert prepared.baseline == "qanet" and set(prepared.runners) >= set(VARIANTS)
    records = []
    for impl, run in prepared.runners.items():
        loss = run()
        assert torch.isfinite(loss) and max_abs_err(loss, prepared.expected_of(impl)) < 1e-4   # vs float64
        records.append({"op": case.op, "case": case.name, "mode": "fwd+bwd", "impl": impl, "median_ms": 2.0,
                        "p25_ms": 1.0, "p75_ms": 3.0, "peak_mem_bytes": None, "max_abs_err": 0.0, "compile_s": None,
                        "bound_ratio": 1.0, "baseline": "qanet"})
    records[-1]["median_ms"] = 1.0
    meta = {"date": "2026-11-23", "device": "cpu", "threads": 1, "dtype": "float32", "torch": "x", "triton": "x",
            "fastqa": "x", "gemm_flops": 1e9, "mem_bw": 1e9}
    md = markdown({"meta": meta, "records": records})
    assert f"| {records[-1]['impl']} | 1.00 [1.00-3.00] | 2.00x (vs qanet) |" in md
