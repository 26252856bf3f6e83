"""QANet model: shapes, masking, fast ≡ reference ≡ naive (outputs and gradients), state_dicts, the char CNN,
dropout / stochastic depth, word vectors, config, and a short loss curve. Tiny configs: runs in seconds."""
from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
from helpers import TOLERANCES, TRAIN_SEED, assert_close, checks_skipped_in, relative_error

from fastqa.models.blocks import masked_log_softmax, timing_signal
from fastqa.models.packing import PackedBatch
from fastqa.models.qanet import QANet, QANetConfig

IMPLS = ("fast", "reference", "naive")


W_VOCAB, C_VOCAB = 40, 25


def tiny_config(**overrides) -> QANetConfig:
    base = dict(word_vocab_size=W_VOCAB, char_vocab_size=C_VOCAB, word_dim=8, char_dim=6, char_channels=8,
                char_kernel=3, d_model=16, heads=2, emb_resize_kernel=3, emb_conv_layers=2, emb_conv_kernel=5,
                model_blocks=2, model_conv_layers=1, model_conv_kernel=3)
    return QANetConfig(**{**base, **overrides})


def make_batch(gen: torch.Generator, B: int = 3, n: int = 17, m: int = 6, W: int = 5,
               c_lens: list[int] | None = None, q_lens: list[int] | None = None):
    """Random ids (never pad/unk unless placed), padded to the given lengths; words have 1..W chars."""
    cw = torch.randint(2, W_VOCAB, (B, n), generator=gen)
    qw = torch.randint(2, W_VOCAB, (B, m), generator=gen)
    cc = torch.randint(2, C_VOCAB, (B, n, W), generator=gen)
    qc = torch.randint(2, C_VOCAB, (B, m, W), generator=gen)
    for chars in (cc, qc):  # ragged word lengths: trailing padding characters
        word_len = torch.randint(1, W + 1, chars.shape[:2], generator=gen)
        chars.masked_fill_(torch.arange(W) >= word_len.unsqueeze(-1), 0)
    for words, chars, lens in ((cw, cc, c_lens), (qw, qc, q_lens)):
        for b, length in enumerate(lens or []):
            words[b, length:] = 0
            chars[b, length:] = 0
    return cw, cc, qw, qc


def built(cfg: QANetConfig, impl: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> QANet:
    torch.manual_seed(seed)
    return QANet(cfg, impl).to(dtype)


@pytest.mark.parametrize("no_answer", [False, True])
def test_shapes_masking_and_normalisation(no_answer):
    gen = torch.Generator().manual_seed(0)
    model = built(tiny_config(no_answer=no_answer), "fast").eval()
    cw, cc, qw, qc = make_batch(gen, c_lens=[17, 9, 12], q_lens=[6, 3, 6])
    with torch.no_grad():
        log_s, log_e = model(cw, cc, qw, qc)
    offset = 1 if no_answer else 0
    for lp in (log_s, log_e):
        assert lp.shape == (3, 17 + offset)
        assert torch.isfinite(lp).all()  # padded positions: finite log-probs, never -inf/NaN
        p = lp.exp()
        assert (p[1, offset + 9:] == 0).all() and (p[2, offset + 12:] == 0).all()
        assert (p[0] > 0).all() and (p[1, : offset + 9] > 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(3))


def test_batch_one_and_context_longer_than_training():
    gen = torch.Generator().manual_seed(1)
    model = built(tiny_config(no_answer=True), "fast").eval()
    for n in (1, 7, 600):  # 600: far longer than any training context (timing signal for any length)
        cw, cc, qw, qc = make_batch(gen, B=1, n=n, m=4)
        with torch.no_grad():
            log_s, log_e = model(cw, cc, qw, qc)
        assert log_s.shape == log_e.shape == (1, n + 1)
        torch.testing.assert_close(log_s.exp().sum(), torch.tensor(1.0))


def test_batched_example_equals_itself_alone_without_padding():
    """An unpadded example in a batch of equal-length examples gives what it gives alone (batch 1)."""
    gen = torch.Generator().manual_seed(2)
    model = built(tiny_config(), "fast").eval()
    cw, cc, qw, qc = make_batch(gen, B=4)
    with torch.no_grad():
        batched = model(cw, cc, qw, qc)
        alone = model(cw[2:3], cc[2:3], qw[2:3], qc[2:3])
    for got, want in zip(alone, batched):
        assert_close(got[0], want[2], name="batch-1 output")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("no_answer", [False, True])
def test_padded_example_equals_itself_alone(impl, no_answer):
    """Padding never reaches a real position (the convolutions read padded rows as zeros, attention masks
    padded keys): a short example padded in a batch gives, at its real positions, what it gives alone."""
    gen = torch.Generator().manual_seed(4)
    model = built(tiny_config(no_answer=no_answer), impl, dtype=torch.float64).eval()
    cw, cc, qw, qc = make_batch(gen, B=3, n=23, m=8, c_lens=[23, 9, 15], q_lens=[8, 3, 5])
    with torch.no_grad():
        batched = model(cw, cc, qw, qc)
        alone = model(cw[1:2, :9], cc[1:2, :9], qw[1:2, :3], qc[1:2, :3])
    keep = 9 + (1 if no_answer else 0)
    for got, want in zip(alone, batched):
        assert_close(got[0], want[1, :keep], name=f"{impl}: padded example vs alone")


def test_empty_question_gives_no_nan():
    gen = torch.Generator().manual_seed(3)
    model = built(tiny_config(), "fast").eval()
    cw, cc, qw, qc = make_batch(gen, q_lens=[6, 0, 6])
    with torch.no_grad():
        log_s, log_e = model(cw, cc, qw, qc)
    assert torch.isfinite(log_s).all() and torch.isfinite(log_e).all()


@pytest.mark.parametrize("no_answer, word_match", [(False, False), (True, False), (False, True)])
def test_fast_reference_naive_same_outputs_and_gradients(no_answer, word_match):
    """Same weights in the three implementations: outputs (eval: fused residual path) and every parameter's
    gradient (training path, dropout and stochastic depth off) agree within the float64 tolerance."""
    cfg = tiny_config(no_answer=no_answer, word_match=word_match, dropout=0.0, char_dropout=0.0, layer_dropout=0.0)
    gen = torch.Generator().manual_seed(4)
    batch = make_batch(gen, c_lens=[17, 11, 14], q_lens=[6, 2, 5])
    models = {impl: built(cfg, impl, seed=5, dtype=torch.float64) for impl in IMPLS}
    state = models["reference"].state_dict()
    for model in models.values():
        model.load_state_dict(state)
    weights = torch.rand(2, 3, 17 + no_answer, generator=gen, dtype=torch.float64)
    outputs, grads = {}, {}
    for impl, model in models.items():
        with torch.no_grad():
            outputs[impl] = model.eval()(*batch)
        log_s, log_e = model.train()(*batch)
        # A loss touching every position (padded ones have exp = 0, hence weight them via p, not log p).
        loss = (weights[0] * log_s.exp()).sum() + (weights[1] * log_e.exp()).sum() - log_s[:, 3].sum()
        loss.backward()
        grads[impl] = {k: p.grad for k, p in model.named_parameters() if p.requires_grad}
        assert all(g is not None for g in grads[impl].values()), f"{impl}: a parameter got no gradient"
    atol, rtol = TOLERANCES["same dtype"][torch.float64]
    for impl in ("fast", "naive"):
        for i, (got, want) in enumerate(zip(outputs[impl], outputs["reference"])):
            assert_close(got, want, name=f"{impl} output {i}", atol=atol, rtol=rtol)
        for name, want in grads["reference"].items():
            assert_close(grads[impl][name], want, name=f"{impl} grad of {name}", atol=atol, rtol=rtol)


@pytest.mark.parametrize("no_answer", [False, True])
def test_cpu_bf16_autocast_fast_tracks_the_float64_model_as_the_reference_does(no_answer):
    """--precision bf16 on the CPU: float32 weights under torch.autocast("cpu", bf16). The fast layers (the C++
    kernels in bf16, no fallback) stay as close to the float64 model, outputs and every parameter's gradient, as
    the reference layers under the same autocast."""
    cfg = tiny_config(no_answer=no_answer, dropout=0.0, char_dropout=0.0, layer_dropout=0.0)
    gen = torch.Generator().manual_seed(4)
    batch = make_batch(gen, c_lens=[17, 11, 14], q_lens=[6, 2, 5])
    weights = torch.rand(2, 3, 17 + no_answer, generator=gen, dtype=torch.float64)
    truth = built(cfg, "reference", seed=5, dtype=torch.float64)
    results = {}
    for impl, model in (("truth", truth), *((i, built(cfg, i, seed=5)) for i in ("fast", "reference"))):
        model.load_state_dict(truth.state_dict())
        with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=impl != "truth"):
            warnings.simplefilter("error", RuntimeWarning)  # a fallback to the reference would warn
            log_s, log_e = model.train()(*batch)
            loss = (weights[0] * log_s.exp()).sum() + (weights[1] * log_e.exp()).sum() - log_s[:, 3].sum()
        loss.backward()
        results[impl] = [log_s, log_e] + [p.grad for p in model.parameters() if p.requires_grad]
    errors = {impl: max(relative_error(g, w) for g, w in zip(results[impl], results["truth"]))
              for impl in ("fast", "reference")}
    assert errors["fast"] <= 2 * errors["reference"] + 1e-2, errors


def test_packed_batch_rows_gaps_segments_and_round_trip():
    mask = torch.tensor([[True, True, True, False], [False, True, True, False], [True, False, False, False]])
    packed = PackedBatch.of(mask, gap=2)
    # sequence 0 at rows 0-2, gap 3-4, sequence 1 (its real positions in order) at 5-6, gap 7-8, sequence 2 at 9
    assert packed.rows.tolist() == [0, 1, 2, 5, 6, 9]
    assert packed.mask[0].tolist() == [True] * 3 + [False] * 2 + [True] * 2 + [False] * 2 + [True]
    assert packed.segments() == [5, 4, 1] and sum(packed.segments()) == packed.mask.shape[1]
    assert packed.per_row(torch.tensor([[1.0, 2.0, 3.0]])).tolist() == [[1.0] * 5 + [2.0] * 4 + [3.0]]
    x = torch.randn(3, 4, 2)
    xp = packed.pack(x)
    assert xp.shape == (1, 10, 2) and not xp[0, ~packed.mask[0]].any()
    torch.testing.assert_close(packed.unpack(xp, (3, 4)), x * mask.unsqueeze(-1), rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_packed_context_path_equals_padded(impl, monkeypatch):
    """Much padding: the context path (resize conv, highway, embedding and model encoders) runs on the real
    context words packed into one row (the fused layers' default) -- the same outputs and parameter gradients
    as the padded computation, in evaluation and in training with stochastic depth (drawn per example)."""
    from fastqa.models.qanet import modeling
    calls, pack = [], PackedBatch.of
    monkeypatch.setattr(modeling.PackedBatch, "of", lambda mask, gap: calls.append(gap) or pack(mask, gap))
    cfg = tiny_config(no_answer=True, dropout=0.0, char_dropout=0.0, layer_dropout=0.5)
    model = built(cfg, impl, seed=6, dtype=torch.float64)
    batch = make_batch(torch.Generator().manual_seed(7), B=4, n=19, m=6, c_lens=[19, 5, 12, 8], q_lens=[6, 2, 4, 6])
    real = (batch[0] != 0).unsqueeze(0)
    real = torch.cat([torch.ones_like(real[..., :1]), real], dim=-1)      # index 0: no answer
    outs, grads = {}, {}
    for packed in (False, True):
        model.pack_padding = packed
        model.zero_grad()
        with torch.no_grad():
            evaluated = model.eval()(*batch)
        torch.manual_seed(8)  # the same stochastic-depth draws
        log_s, log_e = model.train()(*batch)
        (log_s.exp().pow(2).sum() + log_e[:, 4].sum()).backward()
        outs[packed] = (*evaluated, log_s.detach(), log_e.detach())
        grads[packed] = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    gap = max(cfg.emb_resize_kernel, cfg.emb_conv_kernel, cfg.model_conv_kernel) // 2
    assert calls == [gap] * 2  # packed: once per forward (eval and train)
    for i, (got, want) in enumerate(zip(outs[True], outs[False])):
        assert_close(got * real[0], want * real[0], name=f"output {i}")
    assert grads[True].keys() == grads[False].keys() and len(grads[False]) > 0
    for k, want in grads[False].items():
        assert_close(grads[True][k], want, name=f"grad of {k}")


def test_word_match_feature():
    """word_match: 1 where the word occurs in the other text; <pad> and <unk> (id 1) never match; the
    resizer reads one more channel (the last), and what it reads there reaches the answer distribution."""
    model = built(tiny_config(word_match=True), "fast").eval()
    assert model.emb_resize.pointwise.weight.shape[1] == 8 + 8 + 1
    ctx = torch.tensor([[5, 7, 1, 9, 5, 0], [3, 3, 4, 1, 0, 0]])
    qst = torch.tensor([[9, 1, 5, 0], [1, 8, 0, 0]])
    got_c = model._word_match(ctx, qst).squeeze(-1)
    got_q = model._word_match(qst, ctx).squeeze(-1)
    assert got_c.tolist() == [[True, False, False, True, True, False], [False] * 6]
    assert got_q.tolist() == [[True, False, True, False], [False] * 4]
    gen = torch.Generator().manual_seed(9)
    cw, cc, qw, qc = make_batch(gen, B=1, n=12, m=4)
    qw[0, 0] = cw[0, 3]
    with torch.no_grad():
        with_feature = model(cw, cc, qw, qc)[0]
        model.emb_resize.depthwise.weight[-1].zero_()     # the match channel no longer reaches the model
        without = model(cw, cc, qw, qc)[0]
    assert not torch.allclose(with_feature, without)


def test_float32_fast_matches_reference():
    cfg = tiny_config(no_answer=True)
    gen = torch.Generator().manual_seed(6)
    batch = make_batch(gen, c_lens=[17, 8, 13])
    fast, ref = built(cfg, "fast", seed=7).eval(), built(cfg, "reference", seed=8).eval()
    ref.load_state_dict(fast.state_dict())
    with torch.no_grad():
        for got, want in zip(fast(*batch), ref(*batch)):
            assert_close(got.exp(), want.exp(), name="float32 probabilities")


def test_state_dict_round_trip_across_implementations():
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(9)
    batch = make_batch(gen)
    source = built(cfg, "naive", seed=10).eval()
    buf = io.BytesIO()
    torch.save(source.state_dict(), buf)
    keys = list(source.state_dict())
    with torch.no_grad():
        want = source(*batch)
    for impl in IMPLS:
        buf.seek(0)
        target = built(cfg, impl, seed=11).eval()  # different random weights until loaded
        assert list(target.state_dict()) == keys
        target.load_state_dict(torch.load(buf, weights_only=True))  # strict: same names and shapes
        with torch.no_grad():
            for got, w in zip(target(*batch), want):
                assert_close(got.exp(), w.exp(), name=f"{impl} after load")


def test_char_cnn_keeps_words_apart_and_ignores_char_padding():
    model = built(tiny_config(), "fast").eval()
    gen = torch.Generator().manual_seed(12)
    _, cc, _, _ = make_batch(gen, B=2, n=9, W=6)
    with torch.no_grad():
        base = model.char_embedding(cc)
        changed = cc.clone()
        changed[0, 4] = torch.randint(2, C_VOCAB, (6,), generator=gen)
        out = model.char_embedding(changed)
        assert not torch.equal(out[0, 4], base[0, 4])
        others = torch.ones(2, 9, dtype=torch.bool)
        others[0, 4] = False
        assert torch.equal(out[others], base[others])  # neighbours (3 and 5) included
        # More trailing padding characters (a batch with longer words) changes nothing.
        wider = torch.nn.functional.pad(cc, (0, 7))
        assert_close(model.char_embedding(wider), base, name="char embedding with wider W")
        assert (base >= 0).all()
        # No characters at all (every word padding): zeros of the right shape.
        empty = model.char_embedding(torch.zeros(2, 3, 4, dtype=torch.long))
        assert empty.shape == (2, 3, base.shape[-1]) and (empty == 0).all()


@pytest.mark.parametrize("chunk_values", [None, 1, 100])
def test_char_embedding_equals_the_per_word_conv(chunk_values):
    """The table/embedding_bag form equals the plain definition -- embed, Conv1d over each word's characters
    ('same' zero padding), ReLU, max over the real characters -- in value and in both parameters' gradients;
    also when the words go through in chunks (one word, or a few, per chunk)."""
    torch.manual_seed(19)
    model = built(tiny_config(char_kernel=5), "reference", dtype=torch.float64).eval()
    ce = model.char_embedding
    if chunk_values is not None:
        ce._CHUNK_VALUES = chunk_values
    _, cc, _, _ = make_batch(torch.Generator().manual_seed(20), B=2, n=7, W=6)
    cc[1, 6] = 0  # an all-padding word -> zeros

    def plain(chars: torch.Tensor) -> torch.Tensor:
        b, n, w = chars.shape
        flat = chars.reshape(b * n, w)
        h = torch.relu(ce.conv(ce.embed(flat).transpose(1, 2)))              # [B*n, C, W]
        h = h.masked_fill((flat == 0).unsqueeze(1), 0.0)
        return h.amax(dim=2).reshape(b, n, -1)

    got, want = ce(cc), plain(cc)
    atol, rtol = TOLERANCES["same dtype"][torch.float64]
    assert_close(got, want, name="char embedding", atol=atol, rtol=rtol)
    assert (got[1, 6] == 0).all()
    g = torch.randn(got.shape, dtype=torch.float64)
    params = [ce.embed.weight, ce.conv.weight, ce.conv.bias]
    for name, a, b in zip(("embed", "conv.weight", "conv.bias"), torch.autograd.grad(got, params, g),
                          torch.autograd.grad(want, params, g)):
        assert_close(a, b, name=f"grad of {name}", atol=atol, rtol=rtol)


def test_char_embedding_gathers_in_float32_under_bf16_autocast():
    """Under CPU bf16 autocast the character table stays in the float32 parameters' dtype (the einsum that builds it
    would autocast to bf16): the gather sums unrounded taps, so the embedding equals the float32 one."""
    torch.manual_seed(23)
    ce = built(tiny_config(char_kernel=5), "reference").char_embedding.eval()
    _, cc, _, _ = make_batch(torch.Generator().manual_seed(24), B=2, n=7, W=6)
    want = ce(cc)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ce.table().dtype == torch.float32
        got = ce(cc)
    assert got.dtype == torch.float32 and torch.equal(got, want)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_dropout_layer_rate_scale_and_stochastic_depth(impl):
    """The layer set's dropout (fused kernel / plain PyTorch): P(keep) 0.9, kept entries scaled by 1/q, a
    per-example factor of 0 drops the whole branch, the residual is added as it is; identity in eval."""
    from fastqa.models.regularization import survival_scales
    from fastqa.models.qanet.modeling import LAYER_SETS
    torch.manual_seed(21)
    q = 1 - round(0.1 * 65536) / 65536  # the keep probability, quantised to 1/65536
    drop = LAYER_SETS[impl].dropout(0.1)
    x = torch.ones(4, 500, 100)
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.005
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / q))
    assert not torch.equal(y, drop(x))  # a fresh mask per call
    assert drop.eval()(x) is x
    torch.testing.assert_close(drop(x, residual=x), 2 * x)
    drop.train()
    # Sublayer factors: survival 1 keeps every example; 0.5 drops whole examples, the kept ones 1/(q*0.5).
    scales = survival_scales(64, [1.0, 0.5], device=x.device, dtype=x.dtype)
    assert scales.shape == (2, 64)
    residual = torch.randn(64, 50, 20)
    for scale, survival in zip(scales, (1.0, 0.5)):
        branch = drop(torch.ones(64, 50, 20), residual, scale) - residual
        per_example = (branch.abs() > 1e-3).float().mean(dim=(1, 2))
        assert ((per_example == 0) | ((per_example - 0.9).abs() < 0.05)).all()
        dropped = (per_example == 0).float().mean().item()
        assert (dropped == 0) if survival == 1.0 else (0.25 < dropped < 0.75)
        big = branch.abs() > 1e-3
        torch.testing.assert_close(branch[big], torch.full_like(branch[big], 1 / (q * survival)))
    assert survival_scales(4, [1.0], device=x.device, dtype=x.dtype) is None
    # The same seed draws the same factors in every precision (the float64 ground truth of a train step).
    drawn = []
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(22)
        drawn.append(survival_scales(8, [0.9, 0.5], device=x.device, dtype=dtype))
    torch.testing.assert_close(drawn[0].double(), drawn[1])


def test_dropout_off_in_eval_on_in_training():
    cfg = tiny_config(dropout=0.3, char_dropout=0.3, layer_dropout=0.0)
    model = built(cfg, "fast")
    batch = make_batch(torch.Generator().manual_seed(13))
    model.eval()
    with torch.no_grad():
        a, b = model(*batch), model(*batch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    model.train()
    with torch.no_grad():
        c, d = model(*batch), model(*batch)
    assert not torch.equal(c[0], d[0])


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_stochastic_depth_only_in_training(impl):
    """layer_dropout alone (no dropout): training outputs vary from call to call; evaluation is deterministic
    and equals the same weights with stochastic depth off (inverted scaling: eval uses the branches as they
    are), which also equals a training-mode call without any dropout."""
    gen = torch.Generator().manual_seed(14)
    batch = make_batch(gen)
    sd_model = built(tiny_config(dropout=0.0, char_dropout=0.0, layer_dropout=0.9), impl)
    plain = built(tiny_config(dropout=0.0, char_dropout=0.0, layer_dropout=0.0), impl)
    plain.load_state_dict(sd_model.state_dict())
    with torch.no_grad():
        sd_model.train()
        t1, t2 = sd_model(*batch)[0], sd_model(*batch)[0]
        assert not torch.equal(t1, t2)
        sd_model.eval()
        e1, e2 = sd_model(*batch)[0], sd_model(*batch)[0]
        assert torch.equal(e1, e2)
        assert_close(e1, plain.eval()(*batch)[0], name="eval with stochastic depth vs without")
        assert_close(plain.train()(*batch)[0], e1, name="train mode without any dropout vs eval")
    assert sd_model._model_survival[0][0] == pytest.approx(1 - 0.9 / 6)
    assert sd_model._model_survival[-1][-1] == pytest.approx(0.1)


def test_load_word_vectors_pad_zero_frozen_table_trainable_unk():
    cfg = tiny_config()
    model = built(cfg, "fast")
    vectors = torch.randn(W_VOCAB, cfg.word_dim) + 1.0
    model.load_word_vectors(vectors)
    table = model.word_vectors
    assert not table.requires_grad and model.unk_vector.requires_grad
    assert (table[cfg.pad_id] == 0).all()
    assert torch.equal(table[5], vectors[5])
    cw, cc, qw, qc = make_batch(torch.Generator().manual_seed(15), c_lens=[17, 10, 12])
    cw[0, 2] = cfg.unk_id
    log_s, log_e = model.train()(cw, cc, qw, qc)
    (-log_s[:, 0].sum() - log_e[:, 1].sum()).backward()
    assert table.grad is None
    assert model.unk_vector.grad is not None and model.unk_vector.grad.abs().sum() > 0
    before = table.detach().clone()
    torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    assert torch.equal(table, before)
    with pytest.raises(ValueError, match="vectors must have shape"):
        model.load_word_vectors(torch.zeros(W_VOCAB + 1, cfg.word_dim))
    with pytest.raises(TypeError, match="vectors"):
        model.load_word_vectors(torch.zeros(W_VOCAB, cfg.word_dim, dtype=torch.long))


def test_unk_words_read_the_unk_vector():
    """Through the whole model: the table's <unk> row is ignored, the trainable unk_vector is what <unk> reads."""
    cfg = tiny_config()
    model = built(cfg, "fast").eval()
    batch = make_batch(torch.Generator().manual_seed(3), B=1)
    batch[0][0, 2] = cfg.unk_id  # one context word is <unk>
    with torch.no_grad():
        base = model(*batch)[0]
        model.word_vectors[cfg.unk_id] = 100.0
        assert torch.equal(model(*batch)[0], base)
        model.unk_vector.add_(1.0)
        assert not torch.allclose(model(*batch)[0], base)


@pytest.mark.parametrize("no_answer", [False, True])
def test_a_few_dozen_steps_drive_the_loss_down(no_answer):
    cfg = tiny_config(no_answer=no_answer, dropout=0.0, char_dropout=0.0, layer_dropout=0.0)
    model = built(cfg, "fast", seed=16 + TRAIN_SEED).train()
    gen = torch.Generator().manual_seed(17)
    batch = make_batch(gen, B=4, c_lens=[17, 12, 15, 9])
    start = torch.tensor([3, 0, 7, 2])
    end = torch.tensor([5, 4, 7, 8])
    if no_answer:  # gold index + 1; (0, 0) for the unanswerable example
        start, end = start + 1, end + 1
        start[1], end[1] = 0, 0
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(40):
        log_s, log_e = model(*batch)
        loss = torch.nn.functional.nll_loss(log_s, start) + torch.nn.functional.nll_loss(log_e, end)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.25 * losses[0], losses


def test_timing_signal_and_masked_log_softmax():
    sig = timing_signal(1000, 6)
    assert sig.shape == (1000, 6)
    torch.testing.assert_close(sig[0], torch.tensor([0.0, 0, 0, 1, 1, 1]))
    # channel 0 has timescale 1: sin(pos); channel 2 has timescale 1e4: sin(pos / 1e4)
    torch.testing.assert_close(sig[:, 0], torch.sin(torch.arange(1000.0)))
    torch.testing.assert_close(sig[:, 2], torch.sin(torch.arange(1000.0) / 1e4))
    assert timing_signal(3, 5)[:, 4].abs().sum() == 0  # odd width: a zero last channel
    logits = torch.tensor([[1.0, 2.0, 50.0]])
    lp = masked_log_softmax(logits, torch.tensor([[True, True, False]]))
    assert lp.exp()[0, 2] == 0 and torch.isfinite(lp).all()
    torch.testing.assert_close(lp[0, :2], torch.log_softmax(logits[0, :2], 0))
    assert not torch.isnan(lp.exp() * lp).any()


def test_config_presets_round_trip_and_errors():
    paper = QANetConfig.from_preset("paper", word_vocab_size=100, char_vocab_size=50)
    assert (paper.d_model, paper.heads, paper.word_dim, paper.char_dim) == (128, 8, 300, 200)
    assert (paper.emb_conv_layers, paper.emb_conv_kernel, paper.model_blocks, paper.model_conv_layers,
            paper.model_conv_kernel, paper.model_passes) == (4, 7, 7, 2, 5, 3)
    small = QANetConfig.from_preset("small", word_vocab_size=100, char_vocab_size=50, no_answer=True)
    assert small.word_dim == 50 and small.no_answer
    assert small.word_match and not paper.word_match       # the exact-match channel: small only
    assert QANetConfig.from_dict(small.to_dict()) == small
    # A config saved before word_match existed (no key) loads as it was trained: without the channel.
    old = small.to_dict()
    del old["word_match"]
    assert not QANetConfig.from_dict(old).word_match
    with pytest.raises(ValueError, match="unknown QANet preset"):
        QANetConfig.from_preset("huge", word_vocab_size=100, char_vocab_size=50)
    with pytest.raises(ValueError, match="word_vocab_size"):
        QANetConfig.from_preset("small", char_vocab_size=50)
    with pytest.raises(ValueError, match="unknown QANetConfig field"):
        QANetConfig.from_dict({**small.to_dict(), "colour": 1})
    with pytest.raises(ValueError, match="multiple of heads"):
        tiny_config(d_model=18, heads=4)
    with pytest.raises(ValueError, match="dropout"):
        tiny_config(dropout=1.0)
    with pytest.raises(ValueError, match="layers"):
        tiny_config(layers="turbo")
    with pytest.raises(TypeError, match="d_model"):
        tiny_config(d_model=16.0)
    with pytest.raises(ValueError, match="model_conv_kernel"):
        tiny_config(model_conv_kernel=4)
    with pytest.raises(ValueError, match="model_passes"):
        tiny_config(model_passes=2)
    with pytest.raises(ValueError, match="layers"):
        QANet(tiny_config(), "turbo")


def test_forward_rejects_bad_inputs():
    model = built(tiny_config(), "reference").eval()
    cw, cc, qw, qc = make_batch(torch.Generator().manual_seed(18))
    with pytest.raises(TypeError, match="context_words"):
        model(cw.float(), cc, qw, qc)
    with pytest.raises(ValueError, match="question_chars"):
        model(cw, cc, qw, qc[:, :-1])
    with pytest.raises(ValueError, match="context_chars"):
        model(cw, cc[..., 0], qw, qc)
    with pytest.raises(ValueError, match="batch"):
        model(cw, cc, qw[:2], qc[:2])
    for name, args in (("context_words", (cw[:0], cc[:0], qw[:0], qc[:0])), ("question_words", (cw, cc, qw[:, :0], qc[:, :0])),
                       ("context_chars", (cw, cc[..., :0], qw, qc))):
        with pytest.raises(ValueError, match=f"{name} must have a non-zero size in every dimension"):
            model(*args)


@pytest.mark.parametrize("training", [True, False])
def test_forward_checks_its_inputs_once_and_its_layers_skip_the_op_checks(training):
    """QANet.forward checks its ids; the ops its layers call skip their argument checks (every argument is built
    by the model), while the same layer called on its own still checks."""
    model = built(tiny_config(), "fast").train(training)
    seen = checks_skipped_in(model.cq_attention)
    model(*make_batch(torch.Generator().manual_seed(18)))
    assert seen == [True]
    c, masks = torch.randn(2, 5, 16), (torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool))
    model.cq_attention(c, torch.randn(2, 3, 16), *masks)
    assert seen == [True, False]
    with pytest.raises(ValueError, match="q must have shape"):
        model.cq_attention(c, torch.randn(2, 3, 15), *masks)
