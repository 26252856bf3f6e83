"""MTTask pieces: optimizers (Adam, NAG as fairseq fconv), label smoothing, the evaluation's loss/perplexity,
and the two vocabularies (the tutorial's words; SentencePiece subwords, the default)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fastqa.errors import UserError
from fastqa.tasks.translation import MTOptions, build_task


@pytest.fixture()
def files(tmp_path):
    src = ["ein hund läuft .", "zwei katzen schlafen .", "ein mann singt .", "eine frau lacht laut ."] * 3
    tgt = ["a dog runs .", "two cats sleep .", "a man sings .", "a woman laughs loudly ."] * 3
    for name, lines in (("t.de", src), ("t.en", tgt), ("v.de", src[:4] + [""]), ("v.en", tgt[:4] + ["x"])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {k: str(tmp_path / f) for k, f in (("src", "t.de"), ("tgt", "t.en"), ("valid_src", "v.de"),
                                              ("valid_tgt", "v.en"))}


def _task(files, **kw):
    kw.setdefault("config_overrides", dict(embed_dim=16, hidden_dim=16, encoder_layers=1, decoder_layers=1,
                                           dropout=0.0, max_positions=16))
    kw.setdefault("vocab", "word")
    return build_task(MTOptions(**files, min_freq=1, batch_size=4, **kw))


def test_optimizers(files):
    task = _task(files, optimizer="nag")
    opt, sched = task.configure_optimizer(task.model)
    assert isinstance(opt, torch.optim.SGD) and sched is None
    g = opt.param_groups[0]
    assert g["nesterov"] and g["momentum"] == 0.99 and g["lr"] == 0.25
    task = _task(files, optimizer="adam", lr=5e-4)
    opt, _ = task.configure_optimizer(task.model)
    assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["lr"] == 5e-4
    with pytest.raises(UserError, match="--optimizer"):
        MTOptions(**files, optimizer="sgd")
    with pytest.raises(UserError, match="--label-smoothing"):
        MTOptions(**files, label_smoothing=1.0)


def test_loss_label_smoothing_and_evaluation(files):
    plain, smooth = _task(files), _task(files, label_smoothing=0.2)
    smooth.model.load_state_dict(plain.model.state_dict())
    batch = plain.collate(list(range(4)), torch.device("cpu"))
    plain.model.eval()
    smooth.model.eval()
    with torch.no_grad():
        logits, _ = plain.model(batch.src, batch.tgt_in)
        mask = batch.tgt_out != 0
        logp = logits.log_softmax(-1)[mask]
        gold = batch.tgt_out[mask]
        nll = -logp.gather(1, gold[:, None]).mean()
        want_smooth = 0.8 * nll + 0.2 * (-logp.mean(-1)).mean()
        assert float(plain.loss(plain.model, batch)) == pytest.approx(float(nll), rel=1e-5)
        assert float(smooth.loss(smooth.model, batch)) == pytest.approx(float(want_smooth), rel=1e-5)
        # Evaluation: unsmoothed NLL per target token over the validation set; the empty-source pair is left out.
        m = smooth.evaluate(smooth.model)
        assert len(smooth.valid_data) == 4
        v = smooth.valid_data.collate(list(range(4)))
        lv, _ = smooth.model(v.src, v.tgt_in)
        want = F.cross_entropy(lv.flatten(0, 1), v.tgt_out.flatten(), ignore_index=0)
    assert m["val_loss"] == pytest.approx(float(want), rel=1e-5)
    assert m["val_ppl"] == pytest.approx(math.exp(m["val_loss"]), rel=1e-9)
    assert "val_bleu" not in m
    m = _task(files, valid_bleu=3).evaluate(plain.model)
    assert 0.0 <= m["val_bleu"] <= 100.0


def test_training_filters_long_pairs_only(files):
    task = _task(files, max_len=5)  # "eine frau lacht laut ." + <eos> = 6 tokens: dropped from training only
    assert len(task.train_data) == 9 and len(task.valid_data) == 4
    assert task.checkpoint_meta()["config"]["src_vocab_size"] == len(task.src_vocab)
    assert "layers" not in task.checkpoint_meta()["config"]


def test_subword_is_the_default_vocabulary(files):
    pytest.importorskip("sentencepiece")
    from fastqa.data.subword import SubwordModel

    opts = MTOptions(**files)
    assert opts.vocab == "subword" and opts.vocab_size == 8000 and opts.lowercase is None
    task = _task(files, vocab="subword", vocab_size=300)
    meta = task.checkpoint_meta()
    sp = SubwordModel.from_bytes(meta["vocab"]["sentencepiece"])
    assert meta["vocab"]["kind"] == "subword" and meta["vocab"]["joint"] is True
    # one model shared by both sides: the same vocabulary, the model's pieces, fastqa's specials first
    assert task.src_vocab == task.tgt_vocab == sp.to_vocab()
    assert meta["src_vocab"] == meta["tgt_vocab"] == sp.to_vocab().to_dict()
    assert meta["config"]["src_vocab_size"] == meta["config"]["tgt_vocab_size"] == len(sp) <= 300
    assert meta["text"] == {"src_lang": "de", "tgt_lang": "en", "lowercase": False}  # cased
    # The training pairs are pieces of the cased text: "Ein Hund" keeps its capital.
    assert sp.decode(task.train_data.tgt[0]) == "a dog runs ." and task.codec.source_tokens("Ein Hund") == \
        sp.encode("Ein Hund")
    assert task.codec.forbid_ids == (1,)
    # The same data and options learn the same SentencePiece model: a run resumes with an equal meta.
    assert _task(files, vocab="subword", vocab_size=300).checkpoint_meta() == meta


def test_subword_max_len_counts_pieces(files):
    pytest.importorskip("sentencepiece")
    task = _task(files, vocab="subword", vocab_size=300)
    longest = max(len(t) + 1 for t in task.train_data.tgt)
    shorter = _task(files, vocab="subword", vocab_size=300, max_len=longest - 1)
    assert 0 < len(shorter.train_data) < len(task.train_data)
    assert all(len(s) <= longest - 1 and len(t) + 1 <= longest - 1
               for s, t in zip(shorter.train_data.src, shorter.train_data.tgt))


def test_vocabulary_options(files):
    with pytest.raises(UserError, match="--vocab must be one of subword, word"):
        MTOptions(**files, vocab="bpe")
    with pytest.raises(UserError, match="--vocab-size"):
        MTOptions(**files, vocab_size=2)
    pytest.importorskip("sentencepiece")
    # Too few pieces for the text's characters and the 256 byte pieces: a user error naming the flag.
    with pytest.raises(UserError, match="--vocab-size 50: .*too small"):
        _task(files, vocab="subword", vocab_size=50)


def test_the_task_says_its_command_preset_metric_and_evaluation_size(files):
    task = _task(files)
    assert (task.command, task.preset, task.headline_metrics) == ("mt-train", "small", ("val_ppl",))
    assert task.eval_size == len(task.valid_data) == 4
    bleu = _task(files, valid_bleu=2)  # two pairs decoded for BLEU, each counted as four
    assert bleu.headline_metrics == ("val_bleu",) and bleu.eval_size == 4 + 4 * 2
