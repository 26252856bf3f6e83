"""ConvS2S decoding through static buffers (``fastqa.models.convs2s.graphed``, what a CUDA graph replays): the same
tokens and hypotheses as today's decoder, greedy and beam, whatever the sync interval and as sentences leave
the batch (buckets shrink); the buckets; the buffers kept across calls. The capture itself needs CUDA."""
from __future__ import annotations

import pytest
import torch

from fastqa.models.convs2s import beam_search, greedy_decode
from fastqa.models.convs2s.graphed import StaticDecoding, sentence_bucket, source_bucket
from tests.models.test_convs2s_decoding import reverse_batch, trained  # noqa: F401 -- the trained fixture


def test_buckets():
    assert [sentence_bucket(n) for n in (1, 2, 3, 5, 32, 33, 200)] == [1, 2, 4, 8, 32, 64, 224]
    assert source_bucket(9, 32) == 16 and source_bucket(17, 20) == 20 and source_bucket(40, 32) == 40
    with pytest.raises(ValueError, match="n must be >= 1"):
        sentence_bucket(0)


@pytest.mark.parametrize("sync_every", [1, 3])
def test_static_greedy_gives_todays_tokens(trained, sync_every):  # noqa: F811
    src = reverse_batch(torch.Generator().manual_seed(5), 37, lo=2, hi=11)[0]
    want = greedy_decode(trained, src, sync_every=sync_every, graphs=False)
    got = greedy_decode(trained, src, sync_every=sync_every, graphs=True)
    assert got == want
    assert len({len(t) for t in want}) > 3   # sentences of many lengths: they left the batch at different steps
    again = greedy_decode(trained, src[:5], sync_every=sync_every, graphs=True)   # buffers reused, other shapes
    assert again == want[:5]


@pytest.mark.parametrize("sync_every", [1, 4])
def test_static_beam_search_gives_todays_hypotheses(trained, sync_every):  # noqa: F811
    src = reverse_batch(torch.Generator().manual_seed(6), 11, lo=2, hi=9)[0]
    want = beam_search(trained, src, beam=3, nbest=2, sync_every=sync_every, graphs=False)
    got = beam_search(trained, src, beam=3, nbest=2, sync_every=sync_every, graphs=True)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    for hs, ws in zip(got, want):
        for h, w in zip(hs, ws):
            assert h.log_prob == pytest.approx(w.log_prob, rel=1e-5, abs=1e-5)
            torch.testing.assert_close(h.attention, w.attention, rtol=1e-5, atol=1e-6)


def test_static_decoding_keeps_its_buffers_per_key_and_needs_incremental_decoding(trained):  # noqa: F811
    src = reverse_batch(torch.Generator().manual_seed(7), 6)[0]
    decoding = StaticDecoding.of(trained)
    assert StaticDecoding.of(trained) is decoding and decoding.capture is False  # CPU: nothing captured
    greedy_decode(trained, src, graphs=True)
    keys = set(decoding.entries)
    greedy_decode(trained, src, graphs=True)
    assert set(decoding.entries) == keys          # the same keys again: the same buffers
    assert any(k[2] == sentence_bucket(6) for k in keys)
    with pytest.raises(ValueError, match="needs incremental decoding"):
        greedy_decode(trained, src, incremental=False, graphs=True)
    with pytest.raises(ValueError, match="capture=True needs a CUDA model"):
        StaticDecoding(trained, capture=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_decoding_gives_todays_tokens_on_cuda(trained):  # noqa: F811
    import copy

    model = copy.deepcopy(trained).cuda()
    src = reverse_batch(torch.Generator().manual_seed(8), 40, lo=2, hi=11)[0].cuda()
    for _ in range(2):   # the second call replays the graphs the first captured
        assert greedy_decode(model, src, graphs=True) == greedy_decode(model, src, graphs=False)
        got = beam_search(model, src, beam=4, graphs=True)
        want = beam_search(model, src, beam=4, graphs=False)
        assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    assert StaticDecoding.of(model).replays > 0


@pytest.mark.parametrize("beam", [1, 3])
def test_the_static_step_and_its_moves_read_nothing_on_the_host(trained, beam):  # noqa: F811
    """What a graph captures (the step) and what runs between replays (reorder, select) hold no host read: a
    read would fail the capture (checked on the CPU, where the same code runs)."""
    from helpers import HostReads

    src = reverse_batch(torch.Generator().manual_seed(9), 5)[0]
    with torch.no_grad():
        state = trained.initial_state(trained.encode(src), beam)
        static = StaticDecoding(trained).start(state, argmax_exclude=(0, 2) if beam == 1 else None)
        tokens = torch.full((5 * beam,), 2)
        with HostReads() as reads:
            for _ in range(3):
                out, attn = static.step(tokens)
                tokens = out if beam == 1 else out.argmax(1)
                static = static.reorder(torch.arange(5 * beam).flip(0).view(5, beam).flip(0).reshape(-1))
            static = static.select(torch.tensor([0, 3]))
            out, attn = static.step(tokens.view(5, beam)[[0, 3]].reshape(-1))
    assert reads.reads == []
    assert out.shape[0] == 2 * beam and attn.shape == (2 * beam, src.shape[1])


def test_static_decoding_keeps_at_most_its_entries(trained, monkeypatch):  # noqa: F811
    from fastqa.models.convs2s import graphed

    monkeypatch.setattr(graphed, "MAX_ENTRIES", 2)
    decoding = StaticDecoding(trained)
    gen = torch.Generator().manual_seed(10)
    for b in (1, 2, 4, 8):
        state = trained.initial_state(trained.encode(reverse_batch(gen, b)[0]), 1)
        decoding.start(state, argmax_exclude=(0, 2))
    assert [k[2] for k in decoding.entries] == [4, 8]     # the two most recent sentence buckets
