"""QANet's inference through static buffers (``fastqa.models.qanet.graphed``, what a CUDA graph replays): the plain
forward's scores whatever the batch's rows and lengths (padded to a bucket), with and without the no-answer
option, logits or log-probabilities; buffers kept per bucket; and ``QAModel`` answering the same with it. The
capture itself needs CUDA."""
from __future__ import annotations

import pytest
import torch

from fastqa.models.qanet.graphed import LENGTH_MULTIPLE, GraphedReader, length_bucket, row_bucket
from tests.models.test_qanet_model import built, make_batch, tiny_config


def test_buckets():
    assert [row_bucket(n) for n in (1, 3, 17, 32, 33, 100)] == [1, 4, 32, 32, 64, 128]
    assert length_bucket(1) == LENGTH_MULTIPLE and length_bucket(LENGTH_MULTIPLE + 1) == 2 * LENGTH_MULTIPLE
    with pytest.raises(ValueError, match="n must be >= 1"):
        row_bucket(0)


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("no_answer", [False, True])
def test_static_buffer_forward_gives_the_plain_forwards_scores(impl, no_answer):
    model = built(tiny_config(no_answer=no_answer), impl).eval()
    reader = GraphedReader(model)
    assert reader.capture is False                     # CPU: nothing captured
    gen = torch.Generator().manual_seed(3)
    shapes = [(3, 17, 6, [17, 9, 12], [6, 3, 6]), (5, 40, 9, None, None), (3, 20, 4, [20, 2, 11], [4, 4, 1])]
    for b, n, m, c_lens, q_lens in shapes:
        inputs = make_batch(gen, B=b, n=n, m=m, c_lens=c_lens, q_lens=q_lens)
        for logits in (False, True):
            with torch.no_grad():
                want = model(*inputs, logits=logits)
            got = reader(*inputs, logits=logits)
            for g, w in zip(got, want):
                assert g.shape == w.shape
                real = w > torch.finfo(w.dtype).min / 2          # padded positions: the lowest value in both
                torch.testing.assert_close(g[real], w[real], rtol=1e-4, atol=1e-4)
                assert torch.equal(real, g > torch.finfo(g.dtype).min / 2)
    # Rows 3 and 5 pad to 4 and 8; lengths to one multiple: four buckets for six calls per score kind.
    assert len(reader.entries) == 4
    model.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        reader(*make_batch(gen))


def test_qa_model_answers_the_same_through_static_buffers():
    from fastqa.tasks.qa.predictor import QAModel

    reader = QAModel.load(device="cpu")
    assert reader.graphs is False                      # the default off a GPU
    context = ("The Amazon river flows through Brazil, Peru and Colombia. It is about 6,400 km long and carries "
               "more water than any other river. Its basin covers seven million square kilometres.")
    questions = ["How long is the Amazon?", "Which countries does the Amazon flow through?",
                 "How large is its basin?"]
    plain = reader.answer_many([context] * 3, questions)
    reader.graphs = True
    graphed = reader.answer_many([context] * 3, questions)
    assert [a.text for a in graphed] == [a.text for a in plain]
    assert [a.score for a in graphed] == pytest.approx([a.score for a in plain], rel=1e-3, abs=1e-4)
    assert GraphedReader.of(reader.model).entries      # it did read through the buffers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_forward_gives_the_plain_scores_on_cuda():
    model = built(tiny_config(no_answer=True), "fast").cuda().eval()
    reader = GraphedReader(model)
    gen = torch.Generator().manual_seed(4)
    inputs = [t.cuda() for t in make_batch(gen, B=3, n=17, m=6, c_lens=[17, 9, 12], q_lens=[6, 3, 6])]
    with torch.no_grad():
        want = model(*inputs, logits=True)
    for _ in range(3):   # eager through the buffers, captured, replayed
        got = reader(*inputs, logits=True)
        for g, w in zip(got, want):
            real = w > torch.finfo(w.dtype).min / 2
            torch.testing.assert_close(g[real], w[real], rtol=1e-3, atol=1e-3)
    assert reader.replays == 2


def test_the_captured_forward_reads_nothing_on_the_host_on_the_gpu_path(monkeypatch):
    """Filling a bucket's buffers and the forward a graph captures, as a GPU runs QANet (no packing, no char
    compaction): not one host read of tensor data, which would fail the capture."""
    from helpers import NoHostReads

    from fastqa.models import packing
    from fastqa.models.qanet import modeling

    model = built(tiny_config(no_answer=True), "fast").eval()
    reader = GraphedReader(model)
    inputs = make_batch(torch.Generator().manual_seed(6), B=3, n=17, m=6, c_lens=[17, 5, 9], q_lens=[6, 2, 6])
    for module in (packing, modeling):
        monkeypatch.setattr(module, "reads_are_free", lambda device: False)   # the decisions a GPU batch gets
    with NoHostReads():
        s1, s2 = reader(*inputs, logits=True)
    assert s1.shape == s2.shape == (3, 18)
