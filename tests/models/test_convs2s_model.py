"""ConvS2S model: config and presets, fast layers == reference layers, padding, causality, gradient scaling."""
from __future__ import annotations

import pytest
import torch
from helpers import TOLERANCES, TRAIN_SEED, assert_close, checks_skipped_in, relative_error

from fastqa.models.convs2s import ConvS2S, ConvS2SConfig, greedy_decode

PAD, UNK, SOS, EOS = 0, 1, 2, 3




def tiny_config(**overrides) -> ConvS2SConfig:
    kw = dict(src_vocab_size=23, tgt_vocab_size=19, embed_dim=16, hidden_dim=24, encoder_layers=3,
              decoder_layers=2, kernel_size=3, dropout=0.2, max_positions=40)
    kw.update(overrides)
    return ConvS2SConfig(**kw)


def batch(gen: torch.Generator, b: int = 4, s: int = 9, t: int = 7, cfg: ConvS2SConfig | None = None):
    """Right-padded src [b, s] (first row full, the others 2..s tokens) and tgt_in [b, t] starting with sos."""
    cfg = cfg or tiny_config()
    src = torch.randint(4, cfg.src_vocab_size, (b, s), generator=gen)
    lengths = torch.randint(2, s + 1, (b,), generator=gen)
    lengths[0] = s
    src[torch.arange(s).unsqueeze(0) >= lengths.unsqueeze(1)] = PAD
    tgt = torch.randint(4, cfg.tgt_vocab_size, (b, t), generator=gen)
    tgt[:, 0] = SOS
    tgt[1, t - 2:] = PAD  # a shorter target, padded on the right
    return src, tgt


# --- config --------------------------------------------------------------------------------------------------

def test_presets_and_dict_round_trip():
    tut = ConvS2SConfig.from_preset("tutorial", src_vocab_size=7853, tgt_vocab_size=5893)
    assert (tut.embed_dim, tut.hidden_dim, tut.encoder_layers, tut.decoder_layers, tut.kernel_size, tut.dropout) \
        == (256, 512, 10, 10, 3, 0.25)
    small = ConvS2SConfig.from_preset("small", src_vocab_size=100, tgt_vocab_size=90, dropout=0.1, layers="reference")
    assert small.dropout == 0.1 and small.layers == "reference" and small.hidden_dim < tut.hidden_dim
    assert ConvS2SConfig.from_dict(small.to_dict()) == small
    import json
    assert ConvS2SConfig.from_dict(json.loads(json.dumps(tut.to_dict()))) == tut


@pytest.mark.parametrize("call, exc, words", [
    (lambda: ConvS2SConfig.from_preset("huge", src_vocab_size=9, tgt_vocab_size=9), ValueError, "huge"),
    (lambda: ConvS2SConfig.from_preset("small", src_vocab_size=9), ValueError, "needs tgt_vocab_size"),
    (lambda: ConvS2SConfig.from_dict({"src_vocab_size": 9, "tgt_vocab_size": 9, "colour": 1}), ValueError, "colour"),
    (lambda: tiny_config(kernel_size=4), ValueError, "kernel_size"),
    (lambda: tiny_config(dropout=1.0), ValueError, "dropout"),
    (lambda: tiny_config(layers="gpu"), ValueError, "layers"),
    (lambda: tiny_config(eos_id=0), ValueError, "distinct"),
    (lambda: tiny_config(tgt_vocab_size=3), ValueError, "tgt_vocab_size"),
    (lambda: tiny_config(hidden_dim=2.5), TypeError, "hidden_dim"),
])
def test_config_errors_name_the_field(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_bad_inputs_raise_naming_the_argument():
    model = ConvS2S(tiny_config())
    src, tgt = batch(torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="src.*int64"):
        model(src.float(), tgt)
    with pytest.raises(ValueError, match=r"tgt_in holds token id 19 at \(1, 2\)"):
        bad = tgt.clone()
        bad[1, 2] = 19
        model(src, bad)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.full((1, 41), 5), tgt[:1])
    with pytest.raises(ValueError, match="batch size"):
        model(src[:2], tgt)
    with pytest.raises(ValueError, match="layers"):
        ConvS2S(tiny_config(), layers="cuda")


def test_the_model_checks_its_ids_once_and_its_layers_skip_the_op_checks():
    """forward, encode and a search check the ids; the ops of the layers below skip their argument checks (the
    model builds every argument). ``decode`` takes the caller's encoder output, so its ops check it."""
    model = ConvS2S(tiny_config())
    src, tgt = batch(torch.Generator().manual_seed(0))
    encoder, decoder = checks_skipped_in(model.encoder.fc1), checks_skipped_in(model.decoder.fc1)
    model(src, tgt)
    assert encoder == [True] and decoder == [True]
    enc = model.encode(src)
    model.decode(tgt, enc)
    assert encoder == [True, True] and decoder == [True, False]
    greedy_decode(model.eval(), src, max_len_a=0, max_len_b=3)
    assert encoder[2:] == [True] and decoder[2:] == [True] * (len(decoder) - 2) and len(decoder) >= 3   # at least one step


# --- fast == reference ------------------------------------------------------------------------------------------

def test_tutorial_preset_size():
    torch.manual_seed(0)
    model = ConvS2S(ConvS2SConfig.from_preset("tutorial", src_vocab_size=7853, tgt_vocab_size=5893))
    n = sum(p.numel() for p in model.parameters())
    # The tutorial's 37.4M plus Gehring et al.'s per-layer attention projections (10 x 2 x 256 x 512).
    assert 39e6 < n < 41e6, n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_equals_reference_outputs_and_gradients(dtype):
    cfg = tiny_config(dropout=0.2)
    torch.manual_seed(1)
    fast = ConvS2S(cfg, layers="fast").to(dtype)
    ref = ConvS2S(cfg, layers="reference").to(dtype)
    ref.load_state_dict(fast.state_dict())
    assert isinstance(fast.encoder.convs[0], __import__("fastqa").layers.GLUConv1d)
    assert type(ref.encoder.convs[0]) is __import__("fastqa").reference.GLUConv1d
    src, tgt = batch(torch.Generator().manual_seed(2))
    grad_out = torch.randn(src.shape[0], tgt.shape[1], cfg.tgt_vocab_size, dtype=dtype)
    results = []
    for model in (fast, ref):
        model.train()
        torch.manual_seed(3)  # same dropout masks on both: the fused ops draw no random numbers
        logits, attn = model(src, tgt)
        (logits * grad_out).sum().backward()
        results.append((logits, attn, {k: p.grad for k, p in model.named_parameters()}))
    (lf, af, gf), (lr, ar, gr) = results
    atol, rtol = TOLERANCES["same dtype"][dtype]
    assert_close(lf, lr, name="logits", atol=atol, rtol=rtol)
    assert_close(af, ar, name="attention", atol=atol, rtol=rtol)
    assert gf.keys() == gr.keys()
    for k in gr:
        assert_close(gf[k], gr[k], name=f"grad {k}", atol=10 * atol, rtol=10 * rtol)
    assert gf["encoder.convs.0.conv.parametrizations.weight.original1"].abs().sum() > 0


def test_cpu_bf16_fast_tracks_the_float64_model_as_the_reference_does():
    """On the CPU in bf16 -- training under autocast with float32 weights, and inference with bf16 weights (what
    translate --precision bf16 runs) -- the fast layers stay as close to the float64 model as the reference
    layers in the same precision."""
    cfg = tiny_config(dropout=0.0)
    torch.manual_seed(1)
    truth = ConvS2S(cfg, layers="reference").double()
    src, tgt = batch(torch.Generator().manual_seed(2))
    grad_out = torch.randn(src.shape[0], tgt.shape[1], cfg.tgt_vocab_size, dtype=torch.float64)

    def run(model, autocast: bool) -> list[torch.Tensor]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, attn = model.train()(src, tgt)
        (logits.double() * grad_out).sum().backward()
        return [logits, attn] + [p.grad for p in model.parameters()]

    want = run(truth, False)
    with torch.no_grad():
        want_eval = truth.eval()(src, tgt)
    errors = {}
    for layers in ("fast", "reference"):
        model = ConvS2S(cfg, layers=layers)
        model.load_state_dict(truth.state_dict())
        errors[layers] = max(relative_error(g, w) for g, w in zip(run(model, True), want))
        with torch.no_grad():
            got_eval = model.to(torch.bfloat16).eval()(src, tgt)
        assert got_eval[0].dtype == torch.bfloat16
        errors[layers + " bf16 weights"] = max(relative_error(g, w) for g, w in zip(got_eval, want_eval))
    assert errors["fast"] <= 2 * errors["reference"] + 1e-2, errors
    assert errors["fast bf16 weights"] <= 2 * errors["reference bf16 weights"] + 1e-2, errors


def test_state_dict_loads_across_layers():
    cfg = tiny_config()
    torch.manual_seed(4)
    fast = ConvS2S(cfg, layers="fast").eval()
    ref = ConvS2S(cfg, layers="reference").eval()
    src, tgt = batch(torch.Generator().manual_seed(5))
    assert not torch.allclose(fast(src, tgt)[0], ref(src, tgt)[0])
    assert fast.state_dict().keys() == ref.state_dict().keys()
    ref.load_state_dict(fast.state_dict(), strict=True)
    assert_close(ref(src, tgt)[0], fast(src, tgt)[0], name="fast->reference")
    torch.manual_seed(6)
    other = ConvS2S(cfg, layers="reference").eval()
    fast.load_state_dict(other.state_dict(), strict=True)
    assert_close(fast(src, tgt)[0], other(src, tgt)[0], name="reference->fast")


# --- structure -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layers", ["fast", "reference"])
def test_decoder_pads_with_zeros_not_the_pad_index(layers):
    """With zeros before the sequence, the conv taps that look into the past cannot matter at
    position 0; the tutorial's pad-index padding (a constant 1) makes them matter."""
    cfg = tiny_config(pad_id=1, unk_id=0, dropout=0.0)
    torch.manual_seed(7)
    model = ConvS2S(cfg, layers=layers).eval()
    src, tgt = batch(torch.Generator().manual_seed(8), cfg=cfg)
    src[src == PAD] = 4
    before = model(src, tgt)[0]
    with torch.no_grad():
        for conv in model.decoder.convs:
            w = conv.conv.weight.clone()
            w[..., :-1] += torch.randn_like(w[..., :-1])   # every tap but the current position's
            conv.conv.weight = w                             # weight norm's right inverse: g, v from w
    after = model(src, tgt)[0]
    assert_close(after[:, 0], before[:, 0], name="position 0")
    assert (after[:, 1] - before[:, 1]).abs().max() > 1e-3


@pytest.mark.parametrize("layers", ["fast", "reference"])
def test_decoder_is_causal(layers):
    torch.manual_seed(9)
    model = ConvS2S(tiny_config(), layers=layers).eval()
    src, tgt = batch(torch.Generator().manual_seed(10))
    base = model(src, tgt)[0]
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (model.config.tgt_vocab_size - 4) + 4
    out = model(src, changed)[0]
    assert_close(out[:, :4], base[:, :4], name="positions before the change")
    assert (out[:, 4:] - base[:, 4:]).abs().max() > 1e-4


@pytest.mark.parametrize("layers", ["fast", "reference"])
def test_encoder_padding_does_not_change_real_positions(layers):
    cfg = tiny_config()
    torch.manual_seed(11)
    model = ConvS2S(cfg, layers=layers).eval()
    gen = torch.Generator().manual_seed(12)
    src, tgt = batch(gen, b=3, s=8)
    n = int(src[1].ne(PAD).sum())
    alone = src[1:2, :n]
    logits_alone, attn_alone = model(alone, tgt[1:2])
    enc_alone = model.encode(alone)
    for padded in (torch.cat([alone, torch.full((1, 6), PAD)], 1),     # right padding
                   torch.cat([torch.full((1, 3), PAD), alone], 1)):    # left padding
        real = padded[0].ne(PAD)
        logits, attn = model(padded, tgt[1:2])
        enc = model.encode(padded)
        assert_close(enc.keys[:, real], enc_alone.keys, name="encoder keys")
        assert_close(enc.values[:, real], enc_alone.values, name="encoder values")
        assert_close(logits, logits_alone, name="logits")
        assert_close(attn[..., real], attn_alone, name="attention on real tokens")
        assert attn[..., ~real].abs().max() == 0
    # ... and the batch gives the same as each sentence on its own.
    logits_batch = model(src, tgt)[0]
    for i in range(src.shape[0]):
        m = int(src[i].ne(PAD).sum())
        assert_close(logits_batch[i], model(src[i:i + 1, :m], tgt[i:i + 1])[0][0], name=f"sentence {i}")


@pytest.mark.parametrize("layers", ["fast", "reference"])
def test_packed_encoder_equals_padded_encoder(layers, monkeypatch):
    """A batch with much padding is encoded with its real tokens packed into one row: the same keys, values
    and parameter gradients as the padded computation (right and left padding, an empty source)."""
    from fastqa.models import packing
    torch.manual_seed(14)
    model = ConvS2S(tiny_config(dropout=0.0), layers=layers).double()
    src, _ = batch(torch.Generator().manual_seed(15), b=5, s=9)
    src[3] = torch.cat([torch.full((4,), PAD), src[3, :5].clamp(min=4)])    # left-padded
    src[4] = PAD                                                             # no tokens at all
    outs, grads = {}, {}
    for name, threshold in (("padded", 0.0), ("packed", 1.01)):
        monkeypatch.setattr(packing, "PACK_BELOW", threshold)
        model.zero_grad()
        enc = model.encode(src)
        (enc.keys.pow(2).sum() + (enc.values * enc.mask.unsqueeze(-1)).sum()).backward()
        outs[name] = enc
        grads[name] = {k: p.grad.clone() for k, p in model.encoder.named_parameters() if p.grad is not None}
    atol, rtol = TOLERANCES["same dtype"][torch.float64]
    real = src.ne(PAD).unsqueeze(-1)
    assert_close(outs["packed"].keys, outs["padded"].keys, name="keys", atol=atol, rtol=rtol)
    assert_close(outs["packed"].values * real, outs["padded"].values * real, name="values", atol=atol, rtol=rtol)
    assert grads["packed"].keys() == grads["padded"].keys() and len(grads["padded"]) > 0
    for k, want in grads["padded"].items():
        assert_close(grads["packed"][k], want, name=f"grad of {k}", atol=atol, rtol=rtol)


def test_attention_rows_sum_to_one_and_empty_source_gives_no_nan():
    torch.manual_seed(13)
    model = ConvS2S(tiny_config()).eval()
    src, tgt = batch(torch.Generator().manual_seed(14))
    _, attn = model(src, tgt)
    assert_close(attn.sum(-1), torch.ones(attn.shape[:2]), name="attention sums")
    src[2] = PAD
    logits, _ = model(src, tgt)
    assert torch.isfinite(logits).all()


def test_encoder_gradient_is_scaled_by_one_over_twice_the_attention_layers():
    cfg = tiny_config(dropout=0.0, decoder_layers=3)
    torch.manual_seed(15)
    model = ConvS2S(cfg)
    src, tgt = batch(torch.Generator().manual_seed(16))

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(src, tgt)[0].square().mean().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}
    scaled = grads()
    model.encoder.grad_scale = 1.0
    plain = grads()
    for k in ("encoder.fc2.bias", "encoder.convs.1.conv.bias", "encoder.fc1.parametrizations.weight.original1"):
        assert_close(scaled[k], plain[k] / 6, name=k)
    assert_close(scaled["decoder.fc3.bias"], plain["decoder.fc3.bias"], name="decoder untouched")


def test_dropout_only_in_training():
    torch.manual_seed(17)
    model = ConvS2S(tiny_config(dropout=0.3))
    src, tgt = batch(torch.Generator().manual_seed(18))
    model.train()
    assert (model(src, tgt)[0] - model(src, tgt)[0]).abs().max() > 1e-4
    model.eval()
    assert torch.equal(model(src, tgt)[0], model(src, tgt)[0])


@pytest.mark.parametrize("fold_attention", [False, True])
@pytest.mark.parametrize("layers", ["fast", "reference"])
def test_step_by_step_equals_teacher_forcing(layers, fold_attention):
    torch.manual_seed(19)
    model = ConvS2S(tiny_config(), layers=layers).eval()
    src, tgt = batch(torch.Generator().manual_seed(20))
    with torch.no_grad():
        logits, attn = model(src, tgt)
        enc = model.encode(src)
        state = model.initial_state(enc, fold_attention=fold_attention)
        assert len(state.memory) == (model.config.decoder_layers if fold_attention else 0)
        for t in range(tgt.shape[1]):
            step_logits, step_attn, new_state = model.decode_step(tgt[:, t], state)
            assert new_state is not state and new_state.step == state.step + 1 == t + 1
            assert_close(step_logits, logits[:, t], name=f"logits at {t}")
            assert_close(step_attn, attn[:, t], name=f"attention at {t}")
            state = new_state


def test_a_few_training_steps_lower_the_loss():
    cfg = tiny_config(dropout=0.1)
    torch.manual_seed(21 + TRAIN_SEED)
    model = ConvS2S(cfg)
    src, tgt = batch(torch.Generator().manual_seed(22), b=8)
    tgt_out = torch.cat([tgt[:, 1:], torch.full((tgt.shape[0], 1), EOS)], 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        logits, _ = model(src, tgt)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
