"""MTTask pieces: optimizers (Adam, NAG as fairseq fconv), label smoothing, the evaluation's loss/perplexity."""
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
