"""QANet model cases: the ``paper`` preset's inference and train step, registered on import.

One case per batch size (8 and 32; context 400, question 50, 16 characters per word). Modes:

- ``fwd``: inference -- ``model.eval()`` under no_grad, returning the start/end probabilities.
- ``fwd+bwd``: one train step -- forward in training mode (dropout and stochastic depth on), NLL of the
  gold start/end, backward, gradient clipping at 5, Adam(0.8, 0.999, 1e-7, L2 3e-7). The step runs
  with lr 0: Adam does all of its work, but the weights stay put, so every timed call is the same step
  (the RNG is re-seeded at each call: same dropout masks) and its result can be checked.

Implementations, in the registry's vocabulary (so the table and chart show speedups over the reference):
``naive`` = ``QANet(layers="naive")`` (the tutorials' [B, n, m, 3d] trilinear), ``eager`` =
``QANet(layers="reference")`` (pure-PyTorch layers), ``fastqa[cpu]`` / ``fastqa[triton]`` =
``QANet(layers="fast")``; all three load the same weights. The ground truth is the reference model in
float64 with the same inputs, weights and dropout masks.

``python -m benchmarks.cases_qanet [benchmark options]`` runs only these cases (the registry's CLI);
``python -m benchmarks.cases_qanet --profile [--impl fast] [--batch 32] [--mode train]`` prints the
per-operator profile of the step (torch.profiler), i.e. where the model spends its time.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from fastqa.models.qanet import QANet, QANetConfig

from .registry import Case, Prepared, _fastqa_backends, register

WORD_VOCAB = 90_000   # the size of a SQuAD + GloVe-300 word vocabulary: the frozen table's memory
CHAR_VOCAB = 1_000
MAX_WORD_LEN = 16


def paper_config(**overrides: Any) -> QANetConfig:
    return QANetConfig.from_preset("paper", word_vocab_size=WORD_VOCAB, char_vocab_size=CHAR_VOCAB, **overrides)


def make_batch(gen: torch.Generator, B: int, n: int, m: int, W: int = MAX_WORD_LEN) -> dict[str, torch.Tensor]:
    """Random ids padded like a real batch: lengths uniform in [L/2, L] (the first example full), words of
    1..10 characters, gold spans of up to 30 tokens inside each context."""
    def side(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.randint(length // 2, length + 1, (B,), generator=gen)
        lengths[0] = length
        real = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
        words = torch.randint(2, WORD_VOCAB, (B, length), generator=gen) * real
        chars = torch.randint(2, CHAR_VOCAB, (B, length, W), generator=gen)
        word_len = torch.randint(1, min(W, 10) + 1, (B, length), generator=gen)
        chars = chars * (torch.arange(W) < word_len.unsqueeze(-1)) * real.unsqueeze(-1)
        return words, chars
    cw, cc = side(n)
    qw, qc = side(m)
    c_len = (cw != 0).sum(1)
    start = (torch.rand(B, generator=gen) * c_len).long()
    end = torch.minimum(start + torch.randint(0, 30, (B,), generator=gen), c_len - 1)
    return {"context_words": cw, "context_chars": cc, "question_words": qw, "question_chars": qc,
            "start": start, "end": end}


def forward_flops(cfg: QANetConfig, B: int, n: int, m: int, W: int = MAX_WORD_LEN) -> float:
    """Multiply-adds x 2 of the GEMM-like terms of one forward (elementwise work left out)."""
    d, tokens = cfg.d_model, B * (n + m)
    emb_in = cfg.word_dim + cfg.char_channels
    flops = 2.0 * tokens * W * cfg.char_dim * cfg.char_channels * cfg.char_kernel       # char conv
    flops += 2.0 * tokens * emb_in * (cfg.emb_resize_kernel + d)                       # resize to d
    flops += 2 * 2.0 * tokens * d * 2 * d                                              # highway

    def block(length: int, convs: int, k: int) -> float:
        conv = convs * 2.0 * B * length * d * (k + d)
        attention = 2.0 * B * length * d * 4 * d + 4.0 * B * length * length * d   # qkv+out, QK^T and PV
        return conv + attention + 2 * 2.0 * B * length * d * d                       # + feed-forward

    flops += block(n, cfg.emb_conv_layers, cfg.emb_conv_kernel) + block(m, cfg.emb_conv_layers, cfg.emb_conv_kernel)
    flops += 2.0 * B * d * (4 * n * m + n + m) + 2.0 * B * n * 4 * d * d             # CQA + 1x1 resize
    flops += cfg.model_passes * cfg.model_blocks * block(n, cfg.model_conv_layers, cfg.model_conv_kernel)
    return flops + 2 * 2.0 * B * n * 2 * d                                             # heads


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def _model_inputs(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return batch["context_words"], batch["context_chars"], batch["question_words"], batch["question_chars"]


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device`` (mixed precision: fp32 weights, low-precision compute), or
    nothing when ``dtype`` is None."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def inference_runner(model: QANet, batch: dict[str, torch.Tensor], *,
                     autocast: torch.dtype | None = None) -> Callable[[], tuple[torch.Tensor, ...]]:
    """Eval-mode forward under no_grad -> (p_start, p_end) [B, n] (probabilities: padded entries are
    exactly 0 in every dtype). ``autocast``: run the forward under torch.autocast to this dtype."""
    model.eval()
    inputs = _model_inputs(batch)
    device = inputs[0].device

    def infer() -> tuple[torch.Tensor, ...]:
        with torch.no_grad(), autocast_context(device, autocast):
            log_s, log_e = model(*inputs)
        return log_s.exp(), log_e.exp()
    return infer


def train_step_runner(model: QANet, batch: dict[str, torch.Tensor], *, lr: float = 0.0,
                      seed: int | None = 0, autocast: torch.dtype | None = None) -> Callable[[], tuple[torch.Tensor, ...]]:
    """One training step (forward, NLL, backward, clip 5, Adam with the paper's settings) ->
    (loss, p_start of the training forward). ``seed``: re-seed the RNG at each call (same dropout masks).
    ``autocast``: forward and loss under torch.autocast to this dtype (the backward follows the forward's
    casts by itself, so it runs outside the context, as torch's AMP recipe does)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr, betas=(0.8, 0.999), eps=1e-7, weight_decay=3e-7)
    inputs, start, end = _model_inputs(batch), batch["start"], batch["end"]
    device = inputs[0].device

    def step() -> tuple[torch.Tensor, ...]:
        if seed is not None:
            torch.manual_seed(seed)
        opt.zero_grad(set_to_none=True)
        with autocast_context(device, autocast):
            log_s, log_e = model(*inputs)
            loss = F.nll_loss(log_s, start) + F.nll_loss(log_e, end)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        return loss.detach(), log_s.detach().exp()
    return step


def build_models(cfg: QANetConfig, impls: list[str], device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> dict[str, QANet]:
    """The same weights (drawn once, in float32, on the CPU) in each implementation."""
    torch.manual_seed(seed)
    state = QANet(cfg, "reference").state_dict()
    models = {}
    for impl in impls:
        model = QANet(cfg, impl)
        model.load_state_dict(state)
        models[impl] = model.to(device=device, dtype=dtype)
    return models


@dataclass
class QANetCase(Case):
    """QANet ``paper`` at batch B, context n, question m (see the module docstring)."""
    model_case = True
    B: int
    n: int = 400
    m: int = 50
    op: str = "qanet"
    name: str = ""
    shape: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = ("fwd", "fwd+bwd")
    quick: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or f"paper_B{self.B}_n{self.n}_m{self.m}"
        self.shape = {"B": self.B, "n": self.n, "m": self.m, "W": MAX_WORD_LEN, "preset": "paper"}

    def naive_bytes(self, mode: str) -> float:
        """The naive trilinear's [B, n, m, 3d] tensors at float32 (as the op case estimates them)."""
        return 4.0 * self.B * self.n * self.m * 128 * (10 if mode == "fwd+bwd" else 4)

    def prepare(self, mode: str, device: torch.device, dtype: torch.dtype, *, compile: bool,
                naive_limit_bytes: float) -> Prepared:
        cfg = paper_config()
        batch = make_batch(torch.Generator().manual_seed(0), self.B, self.n, self.m)
        make_runner = inference_runner if mode == "fwd" else train_step_runner

        truth_model = build_models(cfg, ["reference"], device, torch.float64)["reference"]
        expected = make_runner(truth_model, _to(batch, device))()
        del truth_model

        unavailable: dict[str, str] = {
            "compiled": "not offered for the model: torch.compile of the whole QANet step takes minutes"}
        impls = {"eager": "reference"}
        need = self.naive_bytes(mode) * dtype.itemsize / 4
        if need <= naive_limit_bytes:
            impls["naive"] = "naive"
        else:
            unavailable["naive"] = f"needs ~{need / 2**30:.1f} GiB > limit {naive_limit_bytes / 2**30:.1f} GiB"
        backends, why = _fastqa_backends(device)
        if backends:
            impls[f"fastqa[{backends[0]}]"] = "fast"
        else:
            unavailable["fastqa"] = why or "no fastqa backend"
        models = build_models(cfg, sorted(set(impls.values())), device, dtype)
        on_device = _to(batch, device)
        runners = {name: make_runner(models[impl], on_device) for name, impl in impls.items()}
        fwd = forward_flops(cfg, self.B, self.n, self.m)
        n_params = sum(p.numel() for p in models["reference"].parameters() if p.requires_grad)
        # Bound: the GEMM work, or reading the weights once (fwd) / weights, grads and Adam's two states.
        param_bytes = n_params * dtype.itemsize
        return Prepared(runners=runners, expected=expected, flops=fwd * (3.0 if mode == "fwd+bwd" else 1.0),
                        bytes=float(param_bytes * (1 if mode == "fwd" else 8)), unavailable=unavailable)


if __name__ != "__main__":  # run as a script, _main imports the module itself (registering once)
    for _B in (8, 32):
        register(QANetCase(B=_B))


def profile_step(impl: str = "fast", B: int = 32, n: int = 400, m: int = 50, mode: str = "train",
                 steps: int = 2, row_limit: int = 30, sort_by: str = "self_cpu_time_total") -> str:
    """Per-operator profile (torch.profiler) of ``steps`` warm calls of the ``paper`` model's train step or
    inference, as a table sorted by ``sort_by``."""
    from torch.profiler import ProfilerActivity, profile

    cfg = paper_config()
    model = build_models(cfg, [impl], torch.device("cpu"), torch.float32)[impl]
    batch = make_batch(torch.Generator().manual_seed(0), B, n, m)
    run = train_step_runner(model, batch) if mode == "train" else inference_runner(model, batch)
    run()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    return prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)


def _main(argv: list[str]) -> int:
    if "--profile" in argv:
        import argparse
        p = argparse.ArgumentParser(prog="python -m benchmarks.cases_qanet --profile")
        p.add_argument("--profile", action="store_true")
        p.add_argument("--impl", default="fast", choices=["fast", "reference", "naive"])
        p.add_argument("--batch", type=int, default=32)
        p.add_argument("--mode", default="train", choices=["train", "infer"])
        p.add_argument("--steps", type=int, default=2)
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--rows", type=int, default=30)
        a = p.parse_args(argv)
        if a.threads:
            torch.set_num_threads(a.threads)
        print(profile_step(a.impl, a.batch, mode=a.mode, steps=a.steps, row_limit=a.rows))
        return 0
    import benchmarks.cases_qanet  # noqa: F401  (registers the cases)
    from benchmarks.__main__ import main
    return main(["--ops", "qanet", *argv])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
