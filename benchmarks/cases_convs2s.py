"""ConvS2S model cases: translation (incremental vs full-recompute decoding) and a training step
(fast vs reference layers), registered on import like the op cases.

Implementations of a translation case (mode "fwd": decoding runs without autograd):
  naive        full-recompute decoding (the decoder re-run over the whole prefix per token, as the
               tutorial), reference layers
  eager        incremental decoding (one GLUConv1d.step per layer and token), reference layers
  fastqa[cpu]  incremental decoding, fast layers (fused kernels)    (fastqa[triton] on a GPU)
so naive / eager is what incremental decoding buys and eager / fastqa what the kernels buy. Weights are
random (seeded), sources 12-30 tokens; with ``max_len_a=1, max_len_b=0`` every translation is as long
as its source (random weights would otherwise run every sentence to 1.2|src| + 10). The result is the
best hypothesis's tokens (padded with -1) and, for beam search, its score.

Two vocabularies, as ``mt-train --vocab`` offers them: ``word`` (the tutorial's Multi30k spaCy
vocabularies, de 7,853 / en 5,893 tokens) and ``subword`` (one SentencePiece model of 8,000 pieces shared
by both sides, ``mt-train``'s default). A subword sentence is longer -- Multi30k's training text has about
1.37 pieces per word, so its cases take sources of 16-41 pieces -- and its search never writes ``<unk>``
(the ``forbid`` of the real decoding path), so tokens/s of the two count different units: compare
sentences/s across vocabularies.

A training-step case (mode "fwd+bwd") times forward + backward + gradient clipping + Adam on one
batch, ``eager`` = reference layers, ``fastqa[cpu]`` = fast layers, same initial weights. Adam runs at
learning rate 0 so the weights and the loss (the result) stay the same from call to call.

``python -m benchmarks.cases_convs2s [--quick] [--threads 2]`` times the cases interleaved in one
process and prints sentences/s and tokens/s (the registry's table has milliseconds only).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fastqa.models.convs2s import ConvS2S, ConvS2SConfig, beam_search, greedy_decode

from . import measure
from .registry import Case, Prepared, _fastqa_backends, register

# Multi30k de->en vocabularies (spaCy tokens, min_freq 2), as the tutorial's.
SRC_VOCAB, TGT_VOCAB = 7853, 5893
# mt-train's default vocabulary: one SentencePiece model of 8,000 pieces for both sides.
SUBWORD_VOCAB = 8000
VOCAB_SIZES = {"word": (SRC_VOCAB, TGT_VOCAB), "subword": (SUBWORD_VOCAB, SUBWORD_VOCAB)}
# The id a subword model's search may never write (fastqa's <unk>).
SUBWORD_FORBID = (1,)


def _config(preset: str, overrides: dict[str, Any], vocab: str = "word") -> ConvS2SConfig:
    src, tgt = VOCAB_SIZES[vocab]
    return ConvS2SConfig.from_preset(preset, **{"src_vocab_size": src, "tgt_vocab_size": tgt, **overrides})


def _models(preset: str, overrides: dict[str, Any], device: torch.device, dtype: torch.dtype, *,
            train: bool, vocab: str = "word") -> dict[str, ConvS2S]:
    """{"reference": ..., "fast": ...} with the same (seeded) weights."""
    torch.manual_seed(0)
    fast = ConvS2S(_config(preset, overrides, vocab), layers="fast")
    ref = ConvS2S(_config(preset, overrides, vocab), layers="reference")
    ref.load_state_dict(fast.state_dict())
    return {k: m.to(device, dtype).train(train) for k, m in (("reference", ref), ("fast", fast))}


def _sources(n: int, lo: int, hi: int, device: torch.device, vocab: int = SRC_VOCAB, seed: int = 0) -> torch.Tensor:
    """[n, hi] random source ids, lengths uniform in [lo, hi], right-padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen)
    src = torch.randint(4, vocab, (n, hi), generator=gen)
    src[torch.arange(hi).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
    return src.to(device)


def _macs_per_token(cfg: ConvS2SConfig, src_len: float) -> tuple[float, float]:
    """Multiply-adds per source token (encoder) and per target token (decoder, with attention over
    src_len positions and the output projection)."""
    e, h, k = cfg.embed_dim, cfg.hidden_dim, cfg.kernel_size
    enc = 2 * e * h + cfg.encoder_layers * 2 * h * h * k
    dec = 2 * e * h + cfg.decoder_layers * (2 * h * h * k + 2 * h * e + 2 * src_len * e) + e * cfg.tgt_vocab_size
    return float(enc), float(dec)


def _pad_rows(rows: list[list[int]]) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)


@dataclass
class TranslateCase(Case):
    """Translate ``sentences`` random sources with the ``preset`` model (ConvS2SConfig ``overrides`` on
    top, e.g. for tests): greedy (beam 1) or beam search; ``vocab`` "word" or "subword" (vocabulary sizes,
    and the subword search's ban on <unk>)."""
    model_case = True
    preset: str
    sentences: int
    beam: int
    quick: bool = False
    min_len: int = 12
    max_len: int = 30
    overrides: dict[str, Any] = field(default_factory=dict)
    vocab: str = "word"
    op: str = "convs2s_translate"
    name: str = ""
    shape: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = ("fwd",)

    def __post_init__(self) -> None:
        if self.vocab not in VOCAB_SIZES:
            raise ValueError(f"vocab must be one of {tuple(VOCAB_SIZES)}, got {self.vocab!r}")
        kind = "greedy" if self.beam == 1 else f"beam{self.beam}"
        # word cases keep their ids (and their results on record); subword cases are named so
        self.name = f"{self.preset}_S{self.sentences}_{kind}" + ("_subword" if self.vocab == "subword" else "")
        self.shape = {"preset": self.preset, "sentences": self.sentences, "beam": self.beam,
                      "src_len": [self.min_len, self.max_len]}
        if self.vocab != "word":
            self.shape["vocab"] = self.vocab

    def decoder(self, model: ConvS2S, src: torch.Tensor, incremental: bool) -> Callable[[], Any]:
        forbid = SUBWORD_FORBID if self.vocab == "subword" else ()
        if self.beam == 1:
            return lambda: _pad_rows(greedy_decode(model, src, max_len_a=1.0, max_len_b=0, incremental=incremental,
                                                   forbid=forbid))

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            hyps = beam_search(model, src, beam=self.beam, max_len_a=1.0, max_len_b=0, incremental=incremental,
                               forbid=forbid)
            return _pad_rows([h[0].tokens for h in hyps]), torch.tensor([h[0].score for h in hyps])
        return run

    def prepare(self, mode: str, device: torch.device, dtype: torch.dtype, *, compile: bool,
                naive_limit_bytes: float) -> Prepared:
        models = _models(self.preset, self.overrides, device, dtype, train=False, vocab=self.vocab)
        src = _sources(self.sentences, self.min_len, self.max_len, device, models["fast"].config.src_vocab_size)
        backends, why = _fastqa_backends(device)
        runners = {"naive": self.decoder(models["reference"], src, incremental=False),
                   "eager": self.decoder(models["reference"], src, incremental=True)}
        for b in backends:  # the fast layers pick the device's backend themselves ("auto")
            runners[f"fastqa[{b}]"] = self.decoder(models["fast"], src, incremental=True)
        unavailable = {"compiled": "not offered for decoding (a Python loop of data-dependent length)"}
        if why is not None:
            unavailable["fastqa"] = why
        expected = runners["eager"]()
        tokens = expected[0] if isinstance(expected, tuple) else expected
        out_tokens = int(tokens.ne(-1).sum()) + tokens.shape[0]      # with each sentence's EOS
        self.shape["out_tokens"] = out_tokens
        cfg = models["fast"].config
        src_tokens = int(src.ne(cfg.pad_id).sum())
        enc, dec = _macs_per_token(cfg, src_tokens / self.sentences)
        flops = 2.0 * (enc * src_tokens + dec * out_tokens * self.beam)
        # Every step reads the decoder's weights once; steps = the longest translation + EOS.
        dec_bytes = sum(p.numel() for p in models["fast"].decoder.parameters()) * dtype.itemsize
        return Prepared(runners=runners, expected=expected, flops=flops, bytes=float(dec_bytes * (tokens.shape[1] + 1)),
                        unavailable=unavailable)


def train_batch(cfg: ConvS2SConfig, batch: int, src_len: int, tgt_len: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random training batch: [batch, src_len] sources and [batch, tgt_len + 1] targets that start
    with <sos> (the decoder reads tgt[:, :-1] and predicts tgt[:, 1:])."""
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, cfg.src_vocab_size, (batch, src_len), generator=gen).to(device)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (batch, tgt_len + 1), generator=gen)
    tgt[:, 0] = cfg.sos_id
    return src, tgt.to(device)


def train_step_runner(model: ConvS2S, src: torch.Tensor, tgt: torch.Tensor, *,
                      autocast: torch.dtype | None = None) -> Callable[[], torch.Tensor]:
    """One training step (forward, cross-entropy, backward, clip 0.1, Adam) -> the loss. Adam runs at learning
    rate 0: it does all its work but leaves the weights (so the loss, the result) unchanged from call to call.
    ``autocast``: forward and loss under torch.autocast to this dtype (the backward outside it)."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    pad = model.config.pad_id

    def step() -> torch.Tensor:
        torch.manual_seed(0)  # the same dropout masks at every call
        with (torch.autocast(src.device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()):
            logits, _ = model(src, tgt[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(),
                                                     ignore_index=pad)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        return loss.detach()
    return step


@dataclass
class TrainStepCase(Case):
    """One training step of the ``preset`` model (with ConvS2SConfig ``overrides``) on a
    [batch, src_len] -> [batch, tgt_len] batch."""
    model_case = True
    preset: str
    batch: int
    src_len: int
    tgt_len: int
    quick: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    op: str = "convs2s_train_step"
    name: str = ""
    shape: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = ("fwd+bwd",)

    def __post_init__(self) -> None:
        self.name = f"{self.preset}_B{self.batch}_S{self.src_len}_T{self.tgt_len}"
        self.shape = {"preset": self.preset, "B": self.batch, "S": self.src_len, "T": self.tgt_len}

    def prepare(self, mode: str, device: torch.device, dtype: torch.dtype, *, compile: bool,
                naive_limit_bytes: float) -> Prepared:
        models = _models(self.preset, self.overrides, device, dtype, train=True)
        cfg = models["fast"].config
        src, tgt = train_batch(cfg, self.batch, self.src_len, self.tgt_len, device)
        backends, why = _fastqa_backends(device)
        runners = {"eager": train_step_runner(models["reference"], src, tgt)}
        for b in backends:
            runners[f"fastqa[{b}]"] = train_step_runner(models["fast"], src, tgt)
        unavailable = {"naive": "the reference layers are the baseline", "compiled": "not offered"}
        if why is not None:
            unavailable["fastqa"] = why
        expected = runners["eager"]()
        enc, dec = _macs_per_token(cfg, self.src_len)
        flops = 3 * 2.0 * self.batch * (enc * self.src_len + dec * self.tgt_len)
        param_bytes = sum(p.numel() for p in models["fast"].parameters()) * dtype.itemsize
        # weights, gradients and Adam's two moments, each read and written about once.
        return Prepared(runners=runners, expected=expected, flops=flops, bytes=float(8 * param_bytes),
                        unavailable=unavailable)


# 200 sentences on the small preset; the tutorial preset (8x the decoder work per token) on 50,
# as its full-recompute decoding of 200 sentences takes minutes per call on a 2-core CPU.
CONVS2S_CASES: list[Case] = [
    TranslateCase("small", 200, beam=5),
    TranslateCase("small", 200, beam=1),
    TranslateCase("tutorial", 50, beam=5),
    TranslateCase("tutorial", 50, beam=1),
    TranslateCase("small", 20, beam=5, quick=True),
    # mt-train's default subword vocabulary: the same sentences, as pieces (about 1.37 per word).
    TranslateCase("small", 200, beam=5, min_len=16, max_len=41, vocab="subword"),
    TranslateCase("small", 200, beam=1, min_len=16, max_len=41, vocab="subword"),
    TrainStepCase("tutorial", 64, 27, 28),
    TrainStepCase("small", 64, 27, 28),
    TrainStepCase("small", 8, 20, 20, quick=True),
]


def register_all() -> None:
    """Add the cases to the benchmark registry (once)."""
    from .registry import CASES
    for case in CONVS2S_CASES:
        if not any(c.id == case.id for c in CASES):
            register(case)


register_all()


# --- direct interleaved timing with throughput ------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cases_convs2s", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick cases only")
    p.add_argument("--cases", nargs="+", help="only cases whose id contains one of these")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    cases = [c for c in CONVS2S_CASES if (c.quick or not args.quick)
             and (not args.cases or any(s in c.id for s in args.cases))]
    if args.list:
        for case in cases:
            print(f"{case.id:<55} modes: {', '.join(case.modes)}")
        return 0
    for case in cases:
        for mode in case.modes:
            t0 = time.perf_counter()
            prepared = case.prepare(mode, device, torch.float32, compile=False, naive_limit_bytes=0)
            print(f"{case.id} [{mode}] shape={case.shape} (prepared in {time.perf_counter() - t0:.0f}s)", flush=True)
            names = list(prepared.runners)
            for impl in names[1:]:  # one untimed call each (prepare ran the first): first-use GEMM probes, caches
                prepared.runners[impl]()
            # measure's interleaved timing, one call a sample and exactly --rounds rounds
            rounds = measure.Settings(min_runs=args.rounds, max_runs=args.rounds, target_s=0.0, min_sample_s=0.0)
            samples = measure.time_interleaved(prepared.runners, device, rounds, est_s=dict.fromkeys(names, 1.0))
            med = {k: statistics.median(v) for k, v in samples.items()}
            for impl, s in med.items():
                extra = ""
                if isinstance(case, TranslateCase):
                    extra = f"  {case.sentences / s:8.1f} sentences/s  {case.shape['out_tokens'] / s:9.0f} tokens/s"
                ratios = "  ".join(f"{other}/{impl} {med[other] / s:5.2f}x" for other in med if other != impl)
                print(f"  {impl:<12} median {s * 1e3:10.1f} ms  (runs: {', '.join(f'{x:.2f}' for x in samples[impl])} s)"
                      f"{extra}  {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
