"""ConvS2S translation end to end on generated data: a copy task learned through the real `mt-train` path
with the tutorial's word vocabulary (`--vocab word`), then the Python API (Translator), `translate` and
`mt-eval` round trips, attention plot, resume, and the error paths (one line on stderr + exit status 2).
The subword vocabulary (the default) has its own module, test_mt_subword.py.

The task: sentences of 3..8 random words from a 12-word vocabulary, target = the same words. A tiny model
(2 + 2 layers, hidden 64) learns it in ~150 steps on one CPU thread. How many test sentences it copies exactly
moves with the arithmetic (0.93 to 1.0 seen between GEMM engines, vector widths and seeds): the thresholds leave
room for that, and the other expectations come from the model itself.
"""
from __future__ import annotations

import io
import json
import shutil

import pytest
from cli_helpers import assert_user_error
from copy_corpus import TINY_CONVS2S, copy_corpus, sentences, write_lines
from helpers import SEED_ARGS
import torch

from fastqa.cli import main
from fastqa.errors import UserError
from fastqa.tasks.translation import Translator
from fastqa.train.checkpoint import load_checkpoint, save_checkpoint

WORDS = "ka lo mi nu po ri sa tu ve xo ya zu".split()
TINY = [*TINY_CONVS2S, "--set", "max_positions=32"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return copy_corpus(tmp_path_factory.mktemp("copy"), WORDS)


def _train_args(c, out, *extra):
    return ["mt-train", "--src", c["train.de"], "--tgt", c["train.en"], "--valid-src", c["val.de"],
            "--valid-tgt", c["val.en"], "--out", str(out), *TINY, "--vocab", "word", "--min-freq", "1",
            "--batch-size", "32",
            "--lr", "3e-3", "--no-progress", "--threads", "1", "--log-every", "10", *SEED_ARGS, *extra]


@pytest.fixture(scope="module")
def model_dir(corpus):
    out = corpus["dir"] / "run"
    assert main(_train_args(corpus, out, "--max-steps", "150", "--valid-bleu", "30")) == 0
    return out


def test_mt_train_writes_a_run_folder(model_dir):
    rows = [json.loads(ln) for ln in (model_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert train[-1]["step"] == 150 and train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert evals[-1]["step"] == 150 and evals[-1]["val_ppl"] < 1.5
    assert evals[-1]["val_ppl"] == pytest.approx(2.718281828 ** evals[-1]["val_loss"], rel=1e-6)
    assert "val_bleu" in evals[-1]
    assert (model_dir / "curve.png").stat().st_size > 1000
    payload = load_checkpoint(model_dir)
    assert payload["kind"] == "convs2s" and payload["step"] == 150
    assert payload["meta"]["src_vocab"]["itos"][:4] == ["<pad>", "<unk>", "<sos>", "<eos>"]
    assert payload["meta"]["text"] == {"src_lang": "de", "tgt_lang": "en", "lowercase": True}
    # A word model's meta is as before subword models existed (no "vocab" entry): old checkpoints are word models.
    assert "vocab" not in payload["meta"] and Translator.load(model_dir).vocab_kind == "word"


def test_copy_task_learned(model_dir, corpus):
    torch.set_num_threads(1)  # restored by the one_thread_for_models fixture
    tr = Translator.load(model_dir)
    want = [s.split() for s in corpus["test"]]

    def tokens(translator, sentences, **kwargs):
        return [t.tokens for t in translator.translate(sentences, **kwargs)]

    greedy = tokens(tr, corpus["test"], beam=1)
    exact = sum(g == w for g, w in zip(greedy, want)) / len(want)
    assert exact >= 0.8, f"greedy exact-sequence accuracy {exact:.2f}"
    beam = tokens(tr, corpus["test"], beam=3)
    assert sum(b == w for b, w in zip(beam, want)) / len(want) >= 0.8
    # Full-recompute decoding gives the same tokens as incremental decoding.
    assert tokens(tr, corpus["test"][:20], beam=1, incremental=False) == greedy[:20]
    # Reference layers load the same weights and translate the same.
    assert tokens(Translator.load(model_dir, layers="reference"), corpus["test"][:20], beam=1) == greedy[:20]




def test_translator_defined_results_for_odd_input(model_dir, capsys):
    torch.set_num_threads(1)
    tr = Translator.load(model_dir)
    results = tr.translate(["ka lo mi", "", "   ", "KA LO MI", "ka QQQ mi"], beam=2)
    out = [t.text for t in results]
    assert out[1] == "" and out[2] == ""
    assert results[1].tokens == results[2].tokens == [] and not results[1].alternatives
    # The sentence alone translates the same, and its upper-case spelling too (lowercased as in training).
    assert out[0] == out[3] == tr.translate(["ka lo mi"], beam=2)[0].text
    assert isinstance(out[4], str)  # an unknown word is read as <unk>: a translation, no error
    assert tr.src_vocab.encode(tr.source_tokens("ka QQQ mi"))[1] == tr.src_vocab.unk_id
    # Longer than the learned positions (32): translated from its first 31 tokens, with a warning.
    long = tr.translate([" ".join(["ka"] * 40)], beam=1)
    assert len(long) == 1 and "translating the first 31" in capsys.readouterr().err
    with pytest.raises(TypeError):
        tr.translate("ka lo")
    with pytest.raises(ValueError, match="beam"):
        tr.translate(["ka"], beam=0)
    best = tr.translate(["ka lo mi nu"], beam=1, attention=True)[0]
    amap = best.attention
    assert amap.source == ["ka", "lo", "mi", "nu", "<eos>"] and amap.target == [*best.tokens, "<eos>"]
    assert amap.weights.shape == (len(amap.target), len(amap.source))
    assert torch.allclose(amap.weights.sum(-1), torch.ones(len(amap.target)), atol=1e-5)
    # A learned copy attends to the word it writes: the diagonal carries most of the weight.
    assert amap.weights[:4].argmax(-1).tolist() == [0, 1, 2, 3]


def _translated(model_dir, sentences: list[str], **kwargs) -> str:
    """The model's own translations of ``sentences`` through the Python API, one line each (the command's
    output is compared with them, not with a string that one machine's rounding happens to produce)."""
    torch.set_num_threads(1)  # restored by the one_thread_for_models fixture
    tr = Translator.load(model_dir)
    return "".join(t.text + "\n" for t in tr.translate(sentences, **kwargs))


def test_translate_cli_stdin_and_file(model_dir, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("ka lo mi\n\nnu po ri sa"))  # no final newline
    plot = tmp_path / "attn.png"
    assert main(["translate", "--model", str(model_dir), "--beam", "1", "--threads", "1",
                 "--plot-attention", str(plot)]) == 0
    cap = capsys.readouterr()
    assert cap.out == _translated(model_dir, ["ka lo mi", "", "nu po ri sa"], beam=1)
    assert "sentences/s" in cap.err and plot.stat().st_size > 1000
    src = write_lines(tmp_path / "in.de", ["ve xo ya", "zu tu ka"])
    assert main(["translate", "--model", str(model_dir), "--input", src, "--no-incremental", "--beam", "2",
                 "--threads", "1"]) == 0
    assert capsys.readouterr().out == _translated(model_dir, ["ve xo ya", "zu tu ka"], beam=2, incremental=False)


BAD = b"ka lo mi\n\xff\xfe\x00 binary\nnu po ri\n"   # line 2 is not UTF-8


def test_translate_names_a_line_that_is_not_text_or_skips_it(model_dir, tmp_path, capsys, monkeypatch):
    base = ["translate", "--model", str(model_dir), "--beam", "1", "--threads", "1"]
    bad_file = tmp_path / "bad.de"
    bad_file.write_bytes(BAD)
    for source, args in (("standard input", base), (str(bad_file), [*base, "--input", str(bad_file)])):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(BAD), encoding="utf-8"))
        assert_user_error(capsys, args, rf"{source}: line 2: not UTF-8 text .*--skip-bad-lines")
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(BAD), encoding="utf-8"))
        assert main([*args, "--skip-bad-lines"]) == 0
        cap = capsys.readouterr()
        # one output line per input line, the bad one empty
        assert cap.out == _translated(model_dir, ["ka lo mi", "", "nu po ri"], beam=1)
        assert "skipped 1 line that was not UTF-8 text (line 2)" in cap.err
    # The Python API: a str holding what was not UTF-8 (lone surrogates) names the sentence.
    tr = Translator.load(model_dir)
    with pytest.raises(UserError, match="sentence 2 is not valid Unicode text"):
        tr.translate(["ka lo", BAD.decode("utf-8", "surrogateescape")])


def test_training_on_blank_lines_names_the_file(corpus, tmp_path, capsys):
    blank = write_lines(tmp_path / "blank.de", ["", "  ", "\t"])
    three = write_lines(tmp_path / "three.en", ["ka", "lo", "mi"])
    assert_user_error(capsys, ["mt-train", "--src", blank, "--tgt", three, "--valid-src", corpus["val.de"],
                               "--valid-tgt", corpus["val.en"], "--out", str(tmp_path / "run"), "--no-progress"],
                      rf"{blank}: every line is empty or blank")


def test_mt_eval_cli(model_dir, corpus, tmp_path, capsys):
    scores, hyps = tmp_path / "scores.json", tmp_path / "hyps.txt"
    assert main(["mt-eval", "--model", str(model_dir), "--src", corpus["test.de"], "--ref", corpus["test.en"],
                 "--beam", "1", "--threads", "1", "--json", str(scores), "--output", str(hyps)]) == 0
    cap = capsys.readouterr()
    out = cap.out.splitlines()
    # sacrebleu's default signature (cased) even for a lowercasing model, with a note on how to get case:lc
    assert out[0].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a") and out[1].startswith("chrF2|nrefs:1|")
    assert out[2].startswith("tokenized BLEU") and "--lowercase" in cap.err
    s = json.loads(scores.read_text())
    assert s["bleu"] > 80 and s["chrf"] > 80 and s["tokenized_bleu"] > 80 and s["sentences"] == 100
    assert s["sacrebleu"] == s["bleu"] and s["vocab"] == "word" and "case:mixed" in s["chrf_signature"]
    assert f"= {s['bleu']:.2f}" in out[0]
    assert main(["mt-eval", "--model", str(model_dir), "--src", corpus["test.de"], "--ref", corpus["test.en"],
                 "--beam", "1", "--threads", "1", "--lowercase"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("BLEU|nrefs:1|case:lc|") and "--lowercase" not in cap.err
    assert hyps.read_text().splitlines() == [h for h in hyps.read_text().splitlines()] and \
        len(hyps.read_text().splitlines()) == 100


def test_resume_continues_the_run(model_dir, corpus, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(model_dir, out)
    assert main(_train_args(corpus, out, "--max-steps", "160", "--resume")) == 0
    assert load_checkpoint(out)["step"] == 160
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"][-2:] == [150, 160]


# --- error paths: one line on stderr, exit status 2 ---------------------------------------------------------

def _fails(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastqa: error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_train_errors(corpus, tmp_path, capsys):
    short = write_lines(tmp_path / "short.en", ["ka", "lo"])
    args = _train_args(corpus, tmp_path / "o1", "--max-steps", "1")
    i = args.index("--tgt")
    _fails(args[:i + 1] + [short] + args[i + 2:], capsys, "train.de has 2000 lines", "short.en has 2")
    empty = tmp_path / "empty.de"
    empty.write_text("")
    i = args.index("--valid-src")
    _fails(args[:i + 1] + [str(empty)] + args[i + 2:], capsys, "empty.de: the file is empty")
    _fails(_train_args(corpus, tmp_path / "none", "--max-steps", "1", "--resume"), capsys, "no such checkpoint")
    _fails(_train_args(corpus, tmp_path / "o2", "--max-steps", "1", "--set", "kernel_size=4"), capsys,
           "kernel_size must be odd")
    odd = write_lines(tmp_path / "text.txt", ["ka"] * 2000)
    i = args.index("--src")
    _fails(args[:i + 1] + [odd] + args[i + 2:], capsys, "text.txt", "--src-lang")


def test_checkpoint_from_another_vocabulary(model_dir, corpus, tmp_path, capsys):
    # Resuming with data whose vocabulary differs is refused before anything is written.
    out = tmp_path / "other"
    shutil.copytree(model_dir, out)
    other = write_lines(tmp_path / "other.en", [s.replace("ka", "kb") for s in sentences(WORDS, 2000, 0)])
    args = _train_args(corpus, out, "--max-steps", "160", "--resume")
    i = args.index("--tgt")
    _fails(args[:i + 1] + [other] + args[i + 2:], capsys, "another config or vocabulary", "tgt_vocab")
    assert load_checkpoint(out)["step"] == 150
    # A checkpoint whose vocabulary does not fit its model.
    payload = load_checkpoint(model_dir)
    payload["meta"]["tgt_vocab"]["itos"].append("extra")
    bad = tmp_path / "bad"
    save_checkpoint(bad, {k: v for k, v in payload.items() if k != "format"})
    with pytest.raises(UserError, match="target vocabulary has 17 tokens but the model was built for 16"):
        Translator.load(bad)
    _fails(["translate", "--model", str(bad)], capsys, "mixes two vocabularies")
    # A checkpoint of another model kind.
    save_checkpoint(tmp_path / "qa", {"kind": "qanet", "meta": {}, "model": {}})
    _fails(["translate", "--model", str(tmp_path / "qa")], capsys, "'qanet' checkpoint, not a translation model")


def test_use_errors(model_dir, corpus, tmp_path, capsys):
    _fails(["translate", "--model", str(tmp_path / "nowhere")], capsys, "no such checkpoint")
    _fails(["mt-eval", "--model", str(model_dir), "--src", corpus["test.de"], "--ref", corpus["val.en"]], capsys,
           "test.de has 100 lines", "val.en has 60")
    empty = tmp_path / "empty.de"
    empty.write_text("")
    _fails(["translate", "--model", str(model_dir), "--input", str(empty)], capsys, "empty.de: the file is empty")
    bad = tmp_path / "x.notaformat"
    _fails(["translate", "--model", str(model_dir), "--input", corpus["test.de"], "--plot-attention", str(bad)],
           capsys, f"--plot-attention {bad}: unknown figure format '.notaformat'; use .png, .pdf, .svg, .eps")
    assert not (tmp_path / "x.notaformat").exists()


def test_bf16_precision_translates_like_fp32(model_dir, corpus, monkeypatch):
    """Translator.load(precision="bf16"): bfloat16 weights, the incremental decoder's state in bf16, the same
    translations of the copy task as float32 (nearly all: a near-tie may go the other way)."""
    from fastqa import _backend

    torch.set_num_threads(1)  # restored by the one_thread_for_models fixture
    monkeypatch.setattr(_backend, "cpu_bf16_support", lambda: "amx_bf16")
    fp32 = Translator.load(model_dir, precision="fp32").translate(corpus["test"], beam=3)
    tr = Translator.load(model_dir, precision="bf16", device="cpu")
    assert {p.dtype for p in tr.model.parameters()} == {torch.bfloat16}
    bf16 = tr.translate(corpus["test"], beam=3)
    same = sum(a.tokens == b.tokens for a, b in zip(fp32, bf16)) / len(fp32)
    assert same >= 0.9, f"{same:.2f} of the translations agree"
