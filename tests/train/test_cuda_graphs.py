"""The graphed train step without a GPU: bucket choice, padding that changes no loss, the static buffers, the
device learning rate and in-place optimizer state, the eager fallback, and the loop's losses with the
static-buffer step equal to the plain step's (``fastqa.train.cuda_graphs``; the capture itself needs CUDA)."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from fastqa.tasks.qa.squad import Limits
from fastqa.tasks.qa.task import QATask, Recipe
from fastqa.tasks.translation import MTOptions, build_task
from fastqa.train import TrainSettings, fit, load_checkpoint, log_warmup
from fastqa.train.cuda_graphs import (BucketPlan, GraphedTrainStep, for_run, length_buckets, pad_dim, plan_for,
                                      prepare_optimizer)
from fastqa.train.distributed import DistEnv
from fastqa.train.loop import _train_step
from tests.squad_fixtures import make_squad
from tests.toy_task import ToyTask


# --------------------------------------------------------------------------------------------- buckets

def test_length_buckets_hold_every_length_at_quantiles():
    lengths = list(range(1, 101))
    assert length_buckets(lengths, 4) == (32, 56, 80, 104)
    assert length_buckets(lengths, 4, multiple=1) == (25, 50, 75, 100)
    assert length_buckets([7, 7, 7], 3) == (8,)              # repeats collapse
    for bad in ([], ):
        with pytest.raises(ValueError, match="at least one"):
            length_buckets(bad)
    with pytest.raises(ValueError, match="count and multiple"):
        length_buckets([3], 0)


def test_bucket_plan_picks_the_smallest_bucket_that_holds_the_batch():
    plan = BucketPlan.of([(10, 3), (40, 9), (25, 5), (33, 12)], count=2, multiple=8)
    assert plan.lengths == ((32, 40), (8, 16))
    assert plan.bucket((10, 3)) == (32, 8)
    assert plan.bucket((33, 9)) == (40, 16)
    assert plan.bucket((41, 1)) is None and plan.bucket((1, 17)) is None
    with pytest.raises(ValueError, match="expected 2 lengths"):
        plan.bucket((1,))
    with pytest.raises(ValueError, match="ascending"):
        BucketPlan(((8, 8),))


def test_pad_dim_pads_one_dimension_at_its_end():
    t = torch.arange(6).view(2, 3)
    assert pad_dim(t, 1, 5, -1).tolist() == [[0, 1, 2, -1, -1], [3, 4, 5, -1, -1]]
    assert pad_dim(t, 0, 3, 9).tolist() == [[0, 1, 2], [3, 4, 5], [9, 9, 9]]
    assert pad_dim(t, -1, 3, 0) is t
    with pytest.raises(ValueError, match="cannot pad"):
        pad_dim(t, 1, 2, 0)


# ----------------------------------------------------------------------------------------- the optimizer

def test_device_learning_rate_is_filled_in_place_by_the_schedule_and_converts_back():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=1e-2)
    sched = log_warmup(opt, 10)
    prepare_optimizer(opt, torch.device("cpu"), graphed=True)
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dtype == torch.float64 and lr.dim() == 0
    before = float(lr)
    p.grad = torch.ones(3)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] is lr and float(lr) > before     # the same tensor, a new rate
    assert float(lr) == pytest.approx(sched.get_last_lr()[0])
    prepare_optimizer(opt, torch.device("cpu"), graphed=False)
    assert isinstance(opt.param_groups[0]["lr"], float) and opt.param_groups[0]["capturable"] is False


def test_graphs_turn_off_with_a_reason_for_what_they_cannot_hold(caplog):
    task = ToyTask()
    sgd = torch.optim.SGD(task.model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger="fastqa.train"):
        assert for_run(task, task.model, sgd, None, wanted=True, device=torch.device("cpu"), distributed=False,
                       amp=None, clip_norm=None, batches=task.train_batches(0)) is None
        adam = torch.optim.Adam(task.model.parameters())
        assert for_run(task, task.model, adam, None, wanted=True, device=torch.device("cpu"), distributed=True,
                       amp=None, clip_norm=None, batches=task.train_batches(0)) is None
        assert for_run(task, task.model, adam, None, wanted=None, device=torch.device("cpu"), distributed=False,
                       amp=None, clip_norm=None, batches=task.train_batches(0)) is None   # default: CUDA only
    text = caplog.text
    assert "SGD has no capturable mode" in text and "a distributed run steps eagerly" in text
    with pytest.raises(ValueError, match="needs a CUDA device"):
        GraphedTrainStep(task, task.model, adam, None, device=torch.device("cpu"), plan=None, capture=True)


# -------------------------------------------------------------------------------- QANet: padding and steps

@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    make_squad(root / "train.json", articles=2, paragraphs=3, people=2, seed=31)
    make_squad(root / "dev.json", articles=1, paragraphs=1, people=2, seed=32)
    return root


def _qa_task(root, dropout: float = 0.0) -> QATask:
    overrides = dict(d_model=16, heads=2, word_dim=16, char_dim=8, char_channels=8, model_blocks=1,
                     emb_conv_layers=1, model_conv_layers=1, dropout=dropout, char_dropout=dropout,
                     layer_dropout=dropout)
    return QATask.from_files(str(root / "train.json"), str(root / "dev.json"), preset="small",
                             overrides=overrides, recipe=Recipe(batch_size=4, warmup_steps=10, lr=1e-2),
                             limits=Limits(), cache_dir=root / "cache", progress=False)


def test_padding_to_a_bucket_changes_no_qanet_loss(squad):
    task = _qa_task(squad)
    task.model.train()
    for indices in task.train_batches(0)[:3]:
        batch = task.collate(indices, torch.device("cpu"))
        n, m = task.graph_lengths(indices)
        assert (n, m) == (batch.context_words.shape[1], batch.question_words.shape[1])
        padded = task.pad_batch(batch, (n + 13, m + 5))
        assert padded.context_chars.shape[1:] == (n + 13, Limits().chars)
        with torch.no_grad():
            plain, bucketed = task.loss(task.model, batch), task.loss(task.model, padded)
        torch.testing.assert_close(bucketed, plain, rtol=1e-5, atol=1e-5)


def _mt_task(root, dropout: float = 0.0):
    src = ["ein hund läuft schnell nach hause .", "zwei katzen .", "ein mann singt .", "eine frau lacht laut ."] * 2
    tgt = ["a dog runs home fast .", "two cats .", "a man sings .", "a woman laughs loudly ."] * 2
    for name, lines in (("t.de", src), ("t.en", tgt), ("v.de", src[:2]), ("v.en", tgt[:2])):
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return build_task(MTOptions(src=str(root / "t.de"), tgt=str(root / "t.en"),
                                valid_src=str(root / "v.de"), valid_tgt=str(root / "v.en"), vocab="word",
                                min_freq=1, batch_size=4,
                                config_overrides=dict(embed_dim=16, hidden_dim=16, encoder_layers=2, decoder_layers=2,
                                                      dropout=dropout, max_positions=32)))


def test_padding_to_a_bucket_changes_no_convs2s_loss(tmp_path):
    task = _mt_task(tmp_path)
    task.model.train()
    for indices in task.train_batches(0):
        batch = task.collate(indices, torch.device("cpu"))
        s, t = task.graph_lengths(indices)
        assert (s, t) == (batch.src.shape[1], batch.tgt_in.shape[1])
        with torch.no_grad():
            plain, padded = task.loss(task.model, batch), task.loss(task.model, task.pad_batch(batch, (s + 7, t + 4)))
        torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-6)


def _plain_losses(task: QATask, batches, clip: float) -> list[float]:
    optimizer, scheduler = task.configure_optimizer(task.model)
    settings = TrainSettings(out_dir="unused", clip_norm=clip)
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return [float(_train_step(task, task.model, optimizer, scheduler, b, b, settings, env, scaler)) for b in batches]


def test_static_buffer_step_matches_the_plain_step_on_qanet(squad):
    batches = _qa_task(squad).train_batches(0)[:6]
    plain_task = _qa_task(squad)
    plain_task.model.train()
    plain = _plain_losses(plain_task, batches, clip=5.0)

    task = _qa_task(squad)
    task.model.train()
    optimizer, scheduler = task.configure_optimizer(task.model)
    prepare_optimizer(optimizer, torch.device("cpu"), graphed=True)
    lr = optimizer.param_groups[0]["lr"]
    plan = plan_for(task, batches, count=2)
    step = GraphedTrainStep(task, task.model, optimizer, scheduler, device=torch.device("cpu"), plan=plan,
                            clip_norm=5.0)
    grads_before = None
    graphed = []
    for b in batches:
        graphed.append(float(step.step(b)))
        grads = [p.grad for p in task.model.parameters() if p.requires_grad]
        if grads_before is None:
            grads_before = grads
        assert all(g is h for g, h in zip(grads, grads_before))   # zeroed in place, never replaced
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(scheduler.get_last_lr()[0])
    assert step.eager_steps == 0 and step.entries and step.summary()["graphs"] == 0   # CPU: nothing captured
    # Padded to the bucket vs as collated: the same values up to the GEMMs' rounding at other shapes. (Not the
    # weights: a bias under a softmax has a gradient of rounding noise alone, which Adam scales up to the rate.)
    assert graphed == pytest.approx(plain, rel=1e-4, abs=1e-5)


def test_a_batch_no_bucket_holds_runs_eagerly_logged_once(squad, caplog):
    task = _qa_task(squad)
    task.model.train()
    optimizer, scheduler = task.configure_optimizer(task.model)
    prepare_optimizer(optimizer, torch.device("cpu"), graphed=True)
    batches = task.train_batches(0)[:3]
    tiny = BucketPlan(((1,), (1,)))           # holds nothing
    step = GraphedTrainStep(task, task.model, optimizer, scheduler, device=torch.device("cpu"), plan=tiny)
    with caplog.at_level(logging.INFO, logger="fastqa.train"):
        losses = [step.step(b) for b in batches]
    assert step.eager_steps == 3 and not step.entries
    assert all(torch.isfinite(x) and x.dtype == torch.float64 for x in losses)
    assert caplog.text.count("fits no bucket") == 1


@pytest.mark.parametrize("model", ["qanet", "convs2s"])
def test_the_captured_region_reads_nothing_on_the_host_on_the_gpu_path(model, squad, tmp_path, monkeypatch):
    """The step a graph captures -- gradients zeroed in place, forward with dropout, backward, clipping -- on a
    padded batch, as a GPU runs the models (no packing, no host-side checks): not one host read of tensor
    data, which would fail the capture. (Adam's capturable step is CUDA-only; SGD stands in for the update.)"""
    from helpers import NoHostReads

    from fastqa.models import packing
    from fastqa.models.convs2s import modeling as convs2s_modeling
    from fastqa.models.qanet import modeling as qanet_modeling

    task = _qa_task(squad, dropout=0.1) if model == "qanet" else _mt_task(tmp_path, dropout=0.1)
    task.model.train()
    params = [p for p in task.model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=0.0)
    batches = task.train_batches(0)[:2]
    step = GraphedTrainStep(task, task.model, sgd, None, device=torch.device("cpu"), plan=plan_for(task, batches),
                            clip_norm=1.0)
    step.step(batches[0])   # the gradients exist from here on, as after a graph's warm-up
    for module in (packing, qanet_modeling, convs2s_modeling):
        monkeypatch.setattr(module, "reads_are_free", lambda device: False)   # the decisions a GPU batch gets
    key, padded = step._key(batches[1], task.collate(batches[1], torch.device("cpu")))
    with NoHostReads():
        loss = step._body(padded)
    assert key is not None and torch.isfinite(loss)


# ------------------------------------------------------------------------------------------- the loop

def _losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "train"]


def test_loop_with_the_static_buffer_step_gives_the_plain_loops_losses_and_says_which_ran(tmp_path):
    runs = {}
    for graphs in (False, True):
        out = tmp_path / f"graphs-{graphs}"
        fit(ToyTask(dropout=0.1), TrainSettings(out_dir=str(out), max_steps=24, log_every=4, eval_every=0,
                                                clip_norm=1.0, progress=False, cuda_graphs=graphs, device="cpu"))
        runs[graphs] = _losses(out)
        assert load_checkpoint(out / "checkpoint.pt")["settings"]["cuda_graphs"] is graphs
    # The same dropout draws in the same order and the same optimizer arithmetic: bit-identical losses.
    assert runs[True] == runs[False] and len(runs[True]) == 6

    # A graphed run's checkpoint (a tensor learning rate) resumes in a plain run, and the reverse.
    out = tmp_path / "graphs-True"
    fit(ToyTask(dropout=0.1), TrainSettings(out_dir=str(out), max_steps=28, log_every=4, eval_every=0,
                                            clip_norm=1.0, progress=False, cuda_graphs=False, resume=True,
                                            device="cpu"))
    assert load_checkpoint(out / "checkpoint.pt")["settings"]["cuda_graphs"] is False
    assert len(_losses(out)) == 7


def test_cuda_graphs_flag_on_the_cpu_is_one_line_error(capsys, tmp_path):
    from tests.cli_helpers import assert_user_error

    text = tmp_path / "a.txt"
    text.write_text("a b\n", encoding="utf-8")
    assert_user_error(capsys, ["mt-train", "--src", text, "--tgt", text, "--valid-src", text, "--valid-tgt", text,
                               "--out", tmp_path / "run", "--cuda-graphs", "--device", "cpu"],
                      r"--cuda-graphs needs a CUDA device")
    assert_user_error(capsys, ["qa-train", "--train", text, "--dev", text, "--out", tmp_path / "run",
                               "--cuda-graphs", "--device", "cpu"], r"--cuda-graphs needs a CUDA device")


# ------------------------------------------------------------------------------------ on a GPU: the capture

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_steps_replay_the_eager_losses_on_cuda(squad):
    """The same batches, eager vs captured: the first steps warm up, the later ones replay their bucket's graph."""
    device = torch.device("cuda")
    batches = _qa_task(squad).train_batches(0)[:8]
    losses = {}
    for capture in (False, True):
        task = _qa_task(squad)
        task.model.to(device).train()
        optimizer, scheduler = task.configure_optimizer(task.model)
        prepare_optimizer(optimizer, device, graphed=True)
        step = GraphedTrainStep(task, task.model, optimizer, scheduler, device=device,
                                plan=plan_for(task, batches, count=1), clip_norm=5.0, capture=capture)
        losses[capture] = [float(step.step(b)) for b in batches]
        if capture:
            summary = step.summary()
            assert summary["graphs"] >= 1 and summary["replays"] >= 1, summary
            assert not summary["capture_errors"], summary
    # Dropout off (_qa_task): the same arithmetic, replayed or issued op by op.
    assert losses[True] == pytest.approx(losses[False], rel=1e-4, abs=1e-5)


def test_a_replay_counts_as_an_in_place_update_of_the_weights():
    """A replay changes the weights behind torch's back (their version counters stay put); the step bumps them,
    so that a cast or a packed layout cached on a weight's version is not served stale to an eager forward."""
    task = ToyTask(dropout=0.0)
    optimizer = torch.optim.Adam(task.model.parameters(), lr=1e-2)
    prepare_optimizer(optimizer, torch.device("cpu"), graphed=True)
    step = GraphedTrainStep(task, task.model, optimizer, None, device=torch.device("cpu"), plan=None)
    batch = task.train_batches(0)[0]
    step.step(batch)
    (entry,) = step.entries.values()

    class Replayed:
        """Stands in for a captured graph: its update is one torch does not see (as a replay's)."""

        def replay(self) -> None:
            for p in task.model.parameters():
                p.data.add_(1.0)

    entry.graph = Replayed()
    before = [p._version for p in task.model.parameters()]
    step.step(batch)
    assert all(p._version > v for p, v in zip(task.model.parameters(), before))
    assert step.replays == 1
