"""ConvS2S decoding: incremental == full recompute, beam 1 == greedy, beam scores == teacher-forced
log-probabilities, batch == one by one, lengths, the decoder state, no host read inside the step loop,
errors."""
from __future__ import annotations

import pytest
import torch
from helpers import TRAIN_SEED, HostReads, assert_close

from fastqa.models.convs2s import ConvS2S, ConvS2SConfig, DecoderState, Hypothesis, beam_search, greedy_decode

PAD, UNK, SOS, EOS = 0, 1, 2, 3
VOCAB = 14




def reverse_batch(gen: torch.Generator, b: int, lo: int = 3, hi: int = 9):
    """Source: random tokens 4..VOCAB-1 of length lo..hi, right-padded; target: the reversed source + eos."""
    lengths = torch.randint(lo, hi + 1, (b,), generator=gen)
    src = torch.full((b, hi), PAD)
    tgt = torch.full((b, hi + 2), PAD)
    for i, n in enumerate(lengths.tolist()):
        toks = torch.randint(4, VOCAB, (n,), generator=gen)
        src[i, :n] = toks
        tgt[i, 0] = SOS
        tgt[i, 1:n + 1] = toks.flip(0)
        tgt[i, n + 1] = EOS
    return src, tgt


@pytest.fixture(scope="module")
def trained() -> ConvS2S:
    """A tiny model trained briefly on reversal: it ends sentences with EOS, so decoding has real choices."""
    cfg = ConvS2SConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, embed_dim=32, hidden_dim=48, encoder_layers=3,
                        decoder_layers=3, kernel_size=3, dropout=0.0, max_positions=32)
    torch.manual_seed(TRAIN_SEED)
    model = ConvS2S(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=4e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(120):
        src, tgt = reverse_batch(gen, 32)
        logits, _ = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def test_src() -> torch.Tensor:
    return reverse_batch(torch.Generator().manual_seed(2), 12)[0]


def teacher_forced_log_prob(model: ConvS2S, src: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + [eos] | src) from one full forward pass."""
    tgt = torch.tensor([[SOS, *tokens, EOS]])
    with torch.no_grad():
        logits, _ = model(src, tgt[:, :-1])
    return torch.log_softmax(logits[0].double(), -1).gather(1, tgt[0, 1:, None]).sum().item()


def strip(src_row: torch.Tensor) -> torch.Tensor:
    return src_row[src_row.ne(PAD)].unsqueeze(0)


# --- greedy --------------------------------------------------------------------------------------------------

def test_trained_model_reverses(trained, test_src):
    """Not a quality bar: the decoding tests below need a model whose outputs end with EOS."""
    out = greedy_decode(trained, test_src)
    ends = sum(len(o) < 1.2 * int(s.ne(PAD).sum()) + 10 for o, s in zip(out, test_src))
    assert ends >= 10, out


@pytest.mark.parametrize("layers", ["fast", "reference"])
def test_incremental_greedy_equals_full_recompute(trained, test_src, layers):
    model = ConvS2S(trained.config, layers=layers).eval()
    model.load_state_dict(trained.state_dict())
    inc = greedy_decode(model, test_src)
    full = greedy_decode(model, test_src, incremental=False)
    assert inc == full
    assert inc == greedy_decode(trained, test_src)  # fast and reference layers agree token for token


def test_incremental_equals_full_recompute_on_random_weights():
    """Random weights: every sentence runs to its maximum length, many steps on the rolling state."""
    cfg = ConvS2SConfig(src_vocab_size=30, tgt_vocab_size=40, embed_dim=16, hidden_dim=24, encoder_layers=2,
                        decoder_layers=4, kernel_size=5, dropout=0.1, max_positions=64)
    torch.manual_seed(3)
    model = ConvS2S(cfg)
    src = torch.randint(4, 30, (5, 11))
    src[2, 6:] = PAD
    assert greedy_decode(model, src) == greedy_decode(model, src, incremental=False)
    inc = beam_search(model, src, beam=3, nbest=3)
    full = beam_search(model, src, beam=3, nbest=3, incremental=False)
    assert [[h.tokens for h in hs] for hs in inc] == [[h.tokens for h in hs] for hs in full]
    for hi, hf in zip(inc, full):
        for a, b in zip(hi, hf):
            assert a.log_prob == pytest.approx(b.log_prob, abs=1e-4)
            assert_close(a.attention, b.attention, name="attention")
    assert model.training  # decoding switched to eval and back


def test_greedy_batch_equals_one_by_one(trained, test_src):
    batched = greedy_decode(trained, test_src)
    assert batched == [greedy_decode(trained, strip(row))[0] for row in test_src]


def test_max_length_is_a_times_src_plus_b():
    cfg = ConvS2SConfig(src_vocab_size=20, tgt_vocab_size=20, embed_dim=8, hidden_dim=8, encoder_layers=1,
                        decoder_layers=1, dropout=0.0, max_positions=30)
    torch.manual_seed(4)
    model = ConvS2S(cfg)
    with torch.no_grad():  # EOS never wins: every sentence runs to its limit
        model.decoder.fc3.bias[EOS] = -1e4
    src = torch.randint(4, 20, (3, 10))
    src[1, 4:] = PAD
    assert [len(o) for o in greedy_decode(model, src, max_len_a=0.5, max_len_b=2)] == [7, 4, 7]
    assert [len(o) for o in greedy_decode(model, src, max_len_a=0, max_len_b=0)] == [0, 0, 0]
    assert [len(o) for o in greedy_decode(model, src, max_len_a=10, max_len_b=0)] == [29, 29, 29]  # positions
    hyps = beam_search(model, src, beam=2, nbest=2, max_len_a=0.5, max_len_b=2)
    assert [[len(h.tokens) for h in hs] for hs in hyps] == [[7, 7], [4, 4], [7, 7]]
    assert all(PAD not in h.tokens and SOS not in h.tokens for hs in hyps for h in hs)


# --- beam search ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("incremental", [True, False])
def test_beam_one_equals_greedy(trained, test_src, incremental):
    hyps = beam_search(trained, test_src, beam=1, incremental=incremental)
    assert [hs[0].tokens for hs in hyps] == greedy_decode(trained, test_src)


@pytest.mark.parametrize("len_penalty", [0.0, 1.0, 2.0])
def test_beam_scores_are_sorted_and_equal_teacher_forced_log_probs(trained, test_src, len_penalty):
    hyps = beam_search(trained, test_src, beam=4, nbest=4, len_penalty=len_penalty)
    for i, hs in enumerate(hyps):
        assert len(hs) == 4 and all(isinstance(h, Hypothesis) for h in hs)
        assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)
        assert len({tuple(h.tokens) for h in hs}) == 4  # distinct hypotheses
        n_src = int(test_src[i].ne(PAD).sum())
        for h in hs:
            assert h.log_prob == pytest.approx(teacher_forced_log_prob(trained, strip(test_src[i]), h.tokens), abs=1e-4)
            assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + 1) ** len_penalty, rel=1e-9)
            assert h.attention.shape == (len(h.tokens) + 1, n_src)
            assert_close(h.attention.sum(-1), torch.ones(len(h.tokens) + 1), name="attention rows")


def test_beam_finds_at_least_greedy_log_prob(trained, test_src):
    greedy = greedy_decode(trained, test_src)
    hyps = beam_search(trained, test_src, beam=5, len_penalty=0.0)
    for i, (g, hs) in enumerate(zip(greedy, hyps)):
        assert hs[0].log_prob >= teacher_forced_log_prob(trained, strip(test_src[i]), g) - 1e-5


def test_beam_batch_equals_one_by_one(trained, test_src):
    batched = beam_search(trained, test_src, beam=3, nbest=2)
    for row, hs in zip(test_src, batched):
        alone = beam_search(trained, strip(row), beam=3, nbest=2)[0]
        assert [h.tokens for h in hs] == [h.tokens for h in alone]
        assert [h.score for h in hs] == pytest.approx([h.score for h in alone], abs=1e-5)


# --- the state ----------------------------------------------------------------------------------------------

def test_state_reorder_follows_rows_and_stays_within_sentences(trained, test_src):
    model = trained
    with torch.no_grad():
        enc = model.encode(test_src[:2])
        state = model.initial_state(enc, rows_per_sentence=3)
        assert state.rows == 6 and len(state.conv_states) == model.config.decoder_layers
        tokens = torch.tensor([SOS] * 6)
        _, _, state = model.decode_step(tokens, state)
        _, _, state = model.decode_step(torch.tensor([4, 5, 6, 7, 8, 9]), state)
        order = torch.tensor([2, 2, 0, 4, 3, 5])
        moved = state.reorder(order)
        for a, b in zip(moved.conv_states, state.conv_states):
            assert torch.equal(a, b[order])
        assert moved.step == state.step and moved.encoder is state.encoder
        # a reordered row continues exactly as the row it came from
        nxt = torch.full((6,), 10)
        got, _, _ = model.decode_step(nxt, moved)
        want, _, _ = model.decode_step(nxt, state)
        assert_close(got, want[order], name="reordered rows")
        with pytest.raises(ValueError, match="sentence"):
            state.reorder(torch.tensor([3, 1, 2, 0, 4, 5]))
        with pytest.raises(ValueError, match="order"):
            state.reorder(torch.tensor([0, 1]))
        sel = state.select(torch.tensor([1]))
        assert sel.rows == 3 and torch.equal(sel.conv_states[0], state.conv_states[0][3:])
        assert torch.equal(sel.encoder.keys, state.encoder.keys[1:])
    assert isinstance(moved, DecoderState)


# --- host reads ----------------------------------------------------------------------------------------------

def _reads_per_step(model: ConvS2S, decode) -> list[int]:
    """Host reads between consecutive decoder steps of ``decode()`` (a greedy or beam search run on the CPU):
    on a GPU each one would stall the launch queue."""
    marks: list[int] = []
    step = model.decode_step

    def counted_step(*args, **kwargs):
        marks.append(len(reads.reads))
        return step(*args, **kwargs)
    model.decode_step = counted_step
    try:
        with HostReads() as reads:
            decode()
    finally:
        del model.decode_step
    return [b - a for a, b in zip(marks, marks[1:])]


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_no_host_read_inside_the_step_loop(trained, test_src, search):
    every = 4

    def decode():
        if search == "greedy":
            return greedy_decode(trained, test_src, sync_every=every)
        return beam_search(trained, test_src, beam=3, nbest=2, sync_every=every)
    per_step = _reads_per_step(trained, decode)
    assert len(per_step) >= 2 * every, "too few steps to tell"
    # The host looks only after every `every`-th step, and then once (which sentences are still running).
    for i, n in enumerate(per_step):
        assert n == (1 if (i + 1) % every == 0 else 0), f"{n} host reads after step {i}: {per_step}"


@pytest.mark.parametrize("every", [1, 3, 100])
def test_the_sync_interval_does_not_change_the_output(trained, test_src, every):
    assert greedy_decode(trained, test_src, sync_every=every) == greedy_decode(trained, test_src)
    got = beam_search(trained, test_src, beam=3, nbest=3, sync_every=every)
    want = beam_search(trained, test_src, beam=3, nbest=3)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    for hs, ws in zip(got, want):
        for h, w in zip(hs, ws):
            assert h.score == pytest.approx(w.score, abs=1e-6)
            assert_close(h.attention, w.attention, name="attention")


# --- errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(beam=0), ValueError, "beam"),
    (dict(beam=2.0), TypeError, "beam"),
    (dict(beam=2, nbest=3), ValueError, "nbest"),
    (dict(len_penalty="1"), TypeError, "len_penalty"),
    (dict(max_len_a=-1), ValueError, "max_len_a"),
    (dict(sync_every=0), ValueError, "sync_every"),
    (dict(sync_every=2.5), TypeError, "sync_every"),
])
def test_beam_search_argument_errors(trained, test_src, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        beam_search(trained, test_src, **kwargs)


def test_decoding_bad_source_raises(trained):
    with pytest.raises(ValueError, match="src"):
        greedy_decode(trained, torch.tensor([[4, 5, 99]]))
    with pytest.raises(ValueError, match="max_len_b"):
        greedy_decode(trained, torch.tensor([[4, 5]]), max_len_b=-2)
