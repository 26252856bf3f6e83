"""Subword translation models (the default vocabulary) end to end on generated data: a cased copy task
learned through `mt-train`, then what a person reading the output relies on -- cased text, never `<unk>`
(even for unseen words and characters), line-by-line answers through a pipe, n-best lists with scores --
and `mt-eval` scoring a model or an existing translation file.

The task: sentences of 3..8 random words from a 12-word vocabulary with capitals, target = the same words.
A tiny model (2 + 2 layers, hidden 64) learns it in ~150 steps on one CPU thread. How many test sentences it
copies exactly moves with the arithmetic (0.92 to 1.0 seen between the GEMM engines and seeds: Adam at a
constant 3e-3 still jumps about): the thresholds below leave room for that, the other expectations come from the
model itself.
"""
from __future__ import annotations

import io
import json
import os
import queue
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from copy_corpus import TINY_CONVS2S, copy_corpus, write_lines
from helpers import SEED_ARGS
import torch

pytest.importorskip("sentencepiece")

from fastqa.cli import main  # noqa: E402
from fastqa.errors import UserError  # noqa: E402
from fastqa.models.convs2s import beam_search, greedy_decode  # noqa: E402
from fastqa.tasks.translation import Translation, Translator  # noqa: E402
from fastqa.data.batching import pad  # noqa: E402
from fastqa.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

WORDS = "Ka lo Mi NU po Ri sa TU ve Xo ya Zu".split()
TINY = [*TINY_CONVS2S, "--set", "max_positions=48"]
UNSEEN = ["Ka Ærøskøbing lo 東京 🙂", "QQQ WWW", "Mi ¿NU? «po»", "ŋ"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return copy_corpus(tmp_path_factory.mktemp("subword-copy"), WORDS)


@pytest.fixture(scope="module")
def model_dir(corpus):
    out = corpus["dir"] / "run"
    args = ["mt-train", "--src", corpus["train.de"], "--tgt", corpus["train.en"], "--valid-src", corpus["val.de"],
            "--valid-tgt", corpus["val.en"], "--out", str(out), *TINY, "--vocab-size", "320", "--batch-size", "32",
            "--lr", "3e-3", "--no-progress", "--threads", "1", "--log-every", "10", "--max-steps", "150",
            "--valid-bleu", "30", *SEED_ARGS]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def translator(model_dir):
    return Translator.load(model_dir)


def test_mt_train_stores_the_subword_model(model_dir, translator):
    payload = load_checkpoint(model_dir)
    meta = payload["meta"]
    assert meta["vocab"]["kind"] == "subword" and isinstance(meta["vocab"]["sentencepiece"], bytes)
    assert meta["text"]["lowercase"] is False
    assert translator.vocab_kind == "subword" and translator.codec.subword.to_bytes() == meta["vocab"]["sentencepiece"]
    assert len(translator.tgt_vocab) == meta["config"]["tgt_vocab_size"] <= 320
    evals = [json.loads(ln) for ln in (model_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in evals if r["kind"] == "eval"][-1]
    assert last["val_ppl"] < 1.5 and last["val_bleu"] > 75  # tokenized BLEU of the detokenized output


def test_cased_copy(translator, corpus):
    torch.set_num_threads(1)  # restored by the one_thread_for_models fixture
    # The copy task has sentences all in lower case on purpose: read them as they are.
    translator.restore_case = False
    try:
        for beam in (1, 3):
            out = [t.text for t in translator.translate(corpus["test"], beam=beam)]
            exact = sum(o == s for o, s in zip(out, corpus["test"])) / len(out)
            assert exact >= 0.8, f"beam {beam}: exact-sentence accuracy {exact:.2f}"
        assert translator.source_tokens("Ka lo") != translator.source_tokens("ka lo")
        as_typed = translator.translate(["Ka lo Mi NU"], beam=1)[0]
    finally:
        translator.restore_case = True
    # The capitals come from the model's pieces: nothing is lowercased on the way in or out (a sentence with a
    # capital is read as typed, case restoration or not).
    assert translator.translate(["Ka lo Mi NU"], beam=1)[0] == as_typed
    assert as_typed.text == translator.detokenize(as_typed.tokens)


def test_a_sentence_typed_in_lower_case_is_read_with_its_case_restored(translator, model_dir, tmp_path, capsys,
                                                                       monkeypatch):
    # Every training sentence's words are cased as WORDS has them: the pieces make that case likeliest (a word
    # is either lower case or capitalised: all capitals, as "NU", are not restored).
    restore = translator.codec.subword.restore_case
    assert restore("ka lo mi ri xo") == "Ka lo Mi Ri Xo"
    assert restore("ka lo, mi-ri: 'xo'") == "Ka lo, Mi-Ri: 'Xo'"
    assert restore("Ka lo mi") == "Ka lo mi" and restore("  ...  ") == "  ...  "    # any capital: as typed
    assert translator.source_tokens("ka lo mi ri") == translator.source_tokens("Ka lo Mi Ri")
    restored = translator.translate(["ka lo mi ri"], beam=1)[0].text
    assert restored == translator.translate(["Ka lo Mi Ri"], beam=1)[0].text
    translator.restore_case = False
    try:
        assert translator.source_tokens("ka lo mi ri") != translator.source_tokens("Ka lo Mi Ri")
        kept = translator.translate(["ka lo mi ri"], beam=1)[0].text
    finally:
        translator.restore_case = True
    # The command does as the Python API: case restored by default, kept with --keep-case.
    monkeypatch.setattr("sys.stdin", io.StringIO("ka lo mi ri\n"))
    assert main(["translate", "--model", str(model_dir), "--beam", "1", "--threads", "1"]) == 0
    assert capsys.readouterr().out == restored + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("ka lo mi ri\n"))
    assert main(["translate", "--model", str(model_dir), "--beam", "1", "--threads", "1", "--keep-case"]) == 0
    assert capsys.readouterr().out == kept + "\n"


def test_never_unk_even_for_unseen_words_and_characters(translator):
    torch.set_num_threads(1)
    # Unseen characters are read as byte pieces, never as <unk>.
    for s in UNSEEN:
        assert translator.src_vocab.unk_id not in translator.src_vocab.encode(translator.source_tokens(s))
    for beam in (1, 3):
        for incremental in (True, False):
            for t in translator.translate(UNSEEN, beam=beam, incremental=incremental):
                text = t.text
                assert "<unk>" not in text and "\u2047" not in text  # SentencePiece writes <unk> as " ⁇ "
    # The search may not pick <unk> even when the model prefers it above everything else.
    model = translator.model
    bias = model.decoder.fc3.bias
    saved = bias.detach().clone()
    try:
        with torch.no_grad():
            bias[translator.tgt_vocab.unk_id] += 1e4
        for beam in (1, 3):
            for incremental in (True, False):
                toks = [t.tokens for t in translator.translate(UNSEEN + ["Ka lo Mi"], beam=beam,
                                                                incremental=incremental)]
                assert all("<unk>" not in t for t in toks), (beam, incremental)
        best = translator.translate(["Ka lo Mi"], beam=3, nbest=3)[0]
        hyps = [best, *best.alternatives]
        assert len(hyps) == 3 and all("<unk>" not in h.tokens for h in hyps)
        # Without the ban the biased model would write it: the test above is not vacuous.
        src = pad([translator.src_vocab.encode(translator.source_tokens("Ka lo Mi")) + [3]], 0)
        assert 1 in greedy_decode(model, src)[0]
    finally:
        with torch.no_grad():
            bias.copy_(saved)


def test_nbest_scores_and_best_equals_beam_search(translator, corpus):
    torch.set_num_threads(1)
    sentences = corpus["test"][:6] + ["", UNSEEN[0]]
    results = translator.translate(sentences, beam=4, nbest=3)
    plain = [t.text for t in translator.translate(sentences, beam=4)]
    assert len(results) == len(sentences) and all(isinstance(t, Translation) for t in results)
    # an empty sentence has no hypothesis: an empty translation, no alternatives
    assert (results[6].text, results[6].tokens, results[6].alternatives) == ("", [], []) and plain[6] == ""
    for i, (sentence, best) in enumerate(zip(sentences, results)):
        if not sentence:
            continue
        hyps = [best, *best.alternatives]
        assert len(hyps) == 3 and all(isinstance(h, Translation) for h in hyps)
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True), scores
        assert len({tuple(h.tokens) for h in hyps}) == 3  # three different hypotheses
        assert all(h.log_prob <= 0 and h.score == pytest.approx(h.log_prob / (len(h.tokens) + 1)) for h in hyps)
        assert hyps[0].text == plain[i] and hyps[0].text == translator.detokenize(hyps[0].tokens)
        # The best is beam search's top hypothesis, with its score.
        ids = translator.src_vocab.encode(translator.source_tokens(sentence)) + [translator.config.eos_id]
        top = beam_search(translator.model, pad([ids], 0), beam=4, forbid=(1,))[0][0]
        assert translator.tgt_vocab.decode(top.tokens) == hyps[0].tokens
        assert hyps[0].score == pytest.approx(top.score, abs=1e-5)
    with_attention = translator.translate(sentences[:1], beam=4, nbest=2, attention=True)[0]
    amap = with_attention.attention
    assert len(with_attention.alternatives) == 1 and with_attention.alternatives[0].attention is None
    assert with_attention.tokens == results[0].tokens   # asking for the attention does not change the search
    assert amap.target == [*with_attention.tokens, "<eos>"] and amap.source[-1] == "<eos>"
    assert amap.source == [*translator.source_tokens(sentences[0]), "<eos>"]
    assert amap.weights.shape == (len(amap.target), len(amap.source))
    assert torch.allclose(amap.weights.sum(-1), torch.ones(len(amap.target)), atol=1e-4)
    d = with_attention.to_dict()
    assert set(d) == {"text", "score", "tokens", "log_prob", "unsure", "entropy", "attention", "alternatives"}
    assert d["unsure"] is False and d["entropy"] is None   # no confidence floor: nothing measured, nothing flagged
    assert d["attention"] == amap.to_dict() and d["alternatives"] == [with_attention.alternatives[0].to_dict()]
    assert d["alternatives"][0]["attention"] is None and d["alternatives"][0]["alternatives"] == []
    assert results[0].to_dict()["attention"] is None
    with pytest.raises(ValueError, match="nbest must be <= beam"):
        translator.translate(["Ka"], beam=2, nbest=3)
    with pytest.raises(ValueError, match="nbest"):
        translator.translate(["Ka"], beam=2, nbest=0)


def test_translate_cli_nbest_and_json(model_dir, translator, tmp_path, capsys, monkeypatch):
    torch.set_num_threads(1)
    src = write_lines(tmp_path / "in.de", ["Ka lo Mi", "", "NU po Ri"])
    assert main(["translate", "--model", str(model_dir), "--input", src, "--beam", "3", "--nbest", "2",
                 "--threads", "1"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[-1] == "" and len(lines) == 6  # 2 + 1 (empty input: empty line) + 2, and the final newline
    assert lines[2] == ""
    rows = [ln.split("\t") for ln in lines[:2] + lines[3:5]]
    assert [r[0] for r in rows] == ["H-0", "H-0", "H-2", "H-2"]
    # The model's own hypotheses, as the Python API gives them for the same batch.
    want = translator.translate(["Ka lo Mi", "", "NU po Ri"], beam=3, nbest=2)
    assert [r[2] for r in rows] == [h.text for i in (0, 2) for h in (want[i], *want[i].alternatives)]
    assert float(rows[0][1]) >= float(rows[1][1]) and float(rows[2][1]) >= float(rows[3][1])
    # stdin redirected from a file (`< in.de`) is batched like --input, with the same output.
    with open(src, encoding="utf-8") as f:
        monkeypatch.setattr("sys.stdin", f)
        assert main(["translate", "--model", str(model_dir), "--beam", "3", "--nbest", "2", "--threads", "1"]) == 0
    assert capsys.readouterr().out.split("\n") == lines
    # --json from a pipe-like stdin: one object per input line, the empty one included.
    monkeypatch.setattr("sys.stdin", io.StringIO("Ka lo Mi\n\n東京 Zu\n"))
    assert main(["translate", "--model", str(model_dir), "--beam", "3", "--nbest", "3", "--json", "--attention",
                 "--threads", "1"]) == 0
    objs = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [o["source"] for o in objs] == ["Ka lo Mi", "", "東京 Zu"]
    assert objs[1]["hypotheses"] == [] and "attention" not in objs[1]
    best = objs[0]["hypotheses"][0]
    alone = translator.translate(["Ka lo Mi"], beam=3, nbest=3)[0]     # a pipe is answered line by line
    assert [h["text"] for h in objs[0]["hypotheses"]] == [h.text for h in (alone, *alone.alternatives)]
    assert set(best) == {"text", "score", "tokens", "log_prob", "unsure", "entropy"}
    att = objs[0]["attention"]
    assert att["target"] == [*best["tokens"], "<eos>"] and len(att["weights"]) == len(att["target"])
    assert all(len(row) == len(att["source"]) for row in att["weights"])
    assert all("<unk>" not in h["text"] for o in objs for h in o["hypotheses"])


def test_an_empty_best_translation_still_lists_its_hypotheses(model_dir, translator, tmp_path, capsys):
    # A model biased to end every sentence at once: the best hypothesis of a non-empty sentence is the empty
    # translation, which is not an empty input line -- --nbest and --json still give its N hypotheses.
    payload = load_checkpoint(model_dir)
    eos = translator.config.eos_id
    for weights in (payload["model"], payload.get("ema") or {}):
        if "decoder.fc3.bias" in weights:
            weights["decoder.fc3.bias"][eos] += 30.0
    save_checkpoint(tmp_path / "eos", {k: v for k, v in payload.items() if k != "format"})
    biased = Translator.load(tmp_path / "eos")
    best = biased.translate(["Ka lo Mi"], beam=3, nbest=2)[0]
    assert (best.text, best.tokens) == ("", []) and best.log_prob < 0 and len(best.alternatives) == 1
    src = write_lines(tmp_path / "in.de", ["Ka lo Mi", ""])
    base = ["translate", "--model", str(tmp_path / "eos"), "--input", src, "--beam", "3", "--nbest", "2",
            "--threads", "1"]
    assert main(base) == 0
    lines = capsys.readouterr().out.split("\n")
    assert [ln.split("\t")[0] for ln in lines[:2]] == ["H-0", "H-0"] and lines[0].split("\t")[2] == ""
    assert lines[1].split("\t")[2] == best.alternatives[0].text and lines[2:] == ["", ""]
    assert main([*base, "--json"]) == 0
    objs = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [h["text"] for h in objs[0]["hypotheses"]] == ["", best.alternatives[0].text]
    assert objs[1]["hypotheses"] == []


def _readline(q: "queue.Queue[str]", timeout: float) -> str:
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no output line within {timeout:.0f} s") from None


def test_translate_answers_each_line_of_a_pipe(model_dir, translator):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "fastqa", "translate", "--model", str(model_dir), "--beam", "2",
                             "--threads", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8", env=env, cwd=str(REPO))
    lines: "queue.Queue[str]" = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True)
    reader.start()
    try:
        # Each answer is read back before the next line is written: the command cannot be waiting for the
        # end of its input, nor for a full buffer.
        for sentence in ["Ka lo Mi", "", "NU po Ri Ærø", "Zu ya Ka"]:
            proc.stdin.write(sentence + "\n")
            proc.stdin.flush()
            answer = _readline(lines, 120)
            assert answer.endswith("\n") and "<unk>" not in answer
            if sentence != "NU po Ri Ærø":
                # What this process's model writes for the line (the other process may multiply on the other
                # GEMM engine: the sentences whose words the copy model learned, not the unseen ones).
                assert answer == "".join(t.text + "\n" for t in translator.translate([sentence], beam=2))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert "decoded 3 sentences" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_mt_eval_of_a_subword_model(model_dir, corpus, tmp_path, capsys):
    scores, hyps = tmp_path / "scores.json", tmp_path / "hyps.txt"
    assert main(["mt-eval", "--model", str(model_dir), "--src", corpus["test.de"], "--ref", corpus["test.en"],
                 "--beam", "2", "--threads", "1", "--json", str(scores), "--output", str(hyps)]) == 0
    cap = capsys.readouterr()
    out = cap.out.splitlines()
    assert out[0].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp") and out[1].startswith("chrF2|")
    assert out[2].startswith("tokenized BLEU") and len(out) == 3 and "--lowercase" not in cap.err
    s = json.loads(scores.read_text())
    assert s["bleu"] > 75 and s["chrf"] > 75 and s["tokenized_bleu"] > 75 and s["vocab"] == "subword"
    assert {"bleu_signature", "chrf_signature", "chrf_line", "bleu_line"} <= set(s)
    assert s["bleu_signature"] in out[0] and s["chrf_signature"] in out[1]
    # Scoring the written translations without the model gives the same figures.
    assert main(["mt-eval", "--hyp", str(hyps), "--ref", corpus["test.en"], "--json", str(tmp_path / "h.json")]) == 0
    again = json.loads((tmp_path / "h.json").read_text())
    assert (again["bleu"], again["chrf"], again["tokenized_bleu"]) == (s["bleu"], s["chrf"], s["tokenized_bleu"])


def test_mt_eval_hyp_equals_sacrebleu_on_the_same_files(tmp_path, capsys):
    sacrebleu = pytest.importorskip("sacrebleu")
    rng = random.Random(5)
    refs = [" ".join(rng.choice(["Ein", "Mann", "fährt", "Rad", "two", "Dogs", "play", "."]) for _ in range(8))
            for _ in range(30)]
    hyps = [" ".join(w.lower() if rng.random() < 0.2 else w for w in r.split() if rng.random() > 0.2) for r in refs]
    hyp_file, ref_file = write_lines(tmp_path / "hyp.txt", hyps), write_lines(tmp_path / "ref.txt", refs)
    out_json = tmp_path / "s.json"
    assert main(["mt-eval", "--hyp", hyp_file, "--ref", ref_file, "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out.splitlines()
    with open(hyp_file, encoding="utf-8") as h, open(ref_file, encoding="utf-8") as r:
        sys_lines = [line.rstrip("\n") for line in h]
        ref_lines = [line.rstrip("\n") for line in r]
    bleu, chrf = sacrebleu.corpus_bleu(sys_lines, [ref_lines]), sacrebleu.corpus_chrf(sys_lines, [ref_lines])
    s = json.loads(out_json.read_text())
    assert s["bleu"] == bleu.score and s["chrf"] == chrf.score and 0 < s["bleu"] < 100
    assert printed[0] == s["bleu_line"] and f"= {bleu.score:.2f}" in printed[0] and "case:mixed" in printed[0]
    assert printed[1] == s["chrf_line"] and f"= {chrf.score:.2f}" in printed[1]
    assert s["tokenized_lang"] == "xx"  # ref.txt does not tell the language: spaCy's neutral tokenizer
    assert main(["mt-eval", "--hyp", hyp_file, "--ref", ref_file, "--lowercase", "--json", str(out_json)]) == 0
    capsys.readouterr()
    s = json.loads(out_json.read_text())
    assert s["bleu"] == sacrebleu.corpus_bleu(sys_lines, [ref_lines], lowercase=True).score
    assert "case:lc" in s["bleu_signature"] and "case:lc" in s["chrf_signature"]


# --- errors: one line on stderr, exit status 2 ----------------------------------------------------------------

def _fails(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastqa: error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err


def test_errors(model_dir, corpus, tmp_path, capsys):
    ref = corpus["test.en"]
    _fails(["mt-eval", "--hyp", corpus["val.en"], "--ref", ref], capsys, "val.en has 60 lines", "test.en has 100")
    _fails(["mt-eval", "--hyp", ref, "--ref", ref, "--model", str(model_dir)], capsys, "leave out --model")
    _fails(["mt-eval", "--ref", ref], capsys, "needs --src")
    _fails(["translate", "--model", str(model_dir), "--beam", "2", "--nbest", "3"], capsys, "--nbest 3 must be <=")
    _fails(["translate", "--model", str(model_dir), "--attention"], capsys, "pass --json")
    base = ["mt-train", "--src", corpus["train.de"], "--tgt", corpus["train.en"], "--valid-src", corpus["val.de"],
            "--valid-tgt", corpus["val.en"], "--out", str(tmp_path / "o"), "--max-steps", "1"]
    _fails([*base, "--vocab", "word", "--vocab-size", "100"], capsys, "--vocab-size")
    _fails([*base, "--min-freq", "2"], capsys, "--min-freq sets the words of --vocab word")
    # A checkpoint whose vocabularies are not its SentencePiece model's pieces.
    payload = load_checkpoint(model_dir)
    payload["meta"]["tgt_vocab"]["itos"][-1] = "▁other"
    save_checkpoint(tmp_path / "bad", {k: v for k, v in payload.items() if k != "format"})
    with pytest.raises(UserError, match="mixes two vocabularies"):
        Translator.load(tmp_path / "bad")


def test_the_shipped_translator_is_the_default(model_dir, translator, tmp_path, monkeypatch, capsys):
    from fastqa import pretrained
    from fastqa.tasks.translation.spec import SPEC as MT_SPEC
    from fastqa.export import export_run

    monkeypatch.setattr(pretrained, "FOLDER", tmp_path)
    with pytest.raises(UserError, match="convs2s-small-multi30k"):
        Translator.load()
    export_run(model_dir, tmp_path / MT_SPEC.shipped, half=False)
    shipped = Translator.load()
    sentences = ["ka Lo mi.", "Nu po ra se."]
    want = [t.text for t in translator.translate(sentences, beam=2)]
    assert [t.text for t in shipped.translate(sentences, beam=2)] == want
    src = write_lines(tmp_path / "in.de", sentences)
    assert main(["translate", "--input", src, "--beam", "2", "--threads", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == want


def test_a_batch_of_sentences_shows_progress_on_stderr(translator, capsys):
    translator.translate(["ka lo", "mi nu", "po ra"], beam=1, progress=True)
    assert "translating" in capsys.readouterr().err
    translator.translate(["ka lo", "mi nu"], beam=1)
    assert "translating" not in capsys.readouterr().err
