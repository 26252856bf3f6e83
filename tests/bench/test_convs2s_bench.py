"""The ConvS2S benchmark cases prepare, run, and every implementation gives the expected result."""
from __future__ import annotations

import pytest
import torch

from benchmarks.cases_convs2s import CONVS2S_CASES, TrainStepCase, TranslateCase
from benchmarks.registry import CASES, max_abs_err




TINY = dict(src_vocab_size=40, tgt_vocab_size=30, embed_dim=16, hidden_dim=24, encoder_layers=2, decoder_layers=2)


@pytest.mark.parametrize("beam", [1, 2])
def test_translate_case_impls_agree(beam):
    case = TranslateCase("small", 3, beam=beam, min_len=3, max_len=6, overrides=TINY)
    prepared = case.prepare("fwd", torch.device("cpu"), torch.float32, compile=False, naive_limit_bytes=0)
    assert {"naive", "eager", "fastqa[cpu]"} <= prepared.runners.keys()
    tokens = prepared.expected[0] if isinstance(prepared.expected, tuple) else prepared.expected
    lengths = tokens.ne(-1).sum(1)
    assert lengths.ge(3).all() and lengths.le(6).all()      # max_len_a=1, max_len_b=0: as long as the source
    assert case.shape["out_tokens"] == int(lengths.sum()) + 3
    for impl, run in prepared.runners.items():
        assert max_abs_err(run(), prepared.expected) < 1e-4, impl
    assert prepared.flops > 0 and prepared.bytes > 0


def test_train_step_case_is_repeatable_and_impls_agree():
    case = TrainStepCase("small", 3, 5, 6, overrides=TINY)
    prepared = case.prepare("fwd+bwd", torch.device("cpu"), torch.float32, compile=False, naive_limit_bytes=0)
    assert {"eager", "fastqa[cpu]"} <= prepared.runners.keys()
    for impl, run in prepared.runners.items():
        first, second = run(), run()
        assert torch.equal(first, second), impl          # lr 0: the weights do not move
        # same dropout masks on both layer kinds (seeded per call), so the same loss
        assert max_abs_err(first, prepared.expected) < 1e-4, impl


def test_cases_are_registered_once():
    import benchmarks.cases_convs2s as mod
    mod.register_all()
    ids = [c.id for c in CASES]
    assert all(ids.count(c.id) == 1 for c in CONVS2S_CASES)
    assert any(c.quick for c in CONVS2S_CASES)
