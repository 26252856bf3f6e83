"""What the convolutional reader costs beside the recurrent ones: one train step of QANet and of the attention
tutorial's baselines (``lstm``, ``lstm-attention``, ``lstm-pointer``) on the same batch, registered on import.

The paper's claim (Yu et al. 2018): at equal length, QANet trains several times faster than RNN readers. Each
case times the four readers' train steps interleaved on one batch (context n, question m, batch B):

- ``paper_B32_n400_m50``: QANet ``paper`` (fast layers) against the baselines' ``base`` preset (300-d words,
  hidden 256, 2 layers) -- the sizes a user trains on a GPU;
- ``small_B32_n400_m50``: the ``small`` presets of both, as trained on the CPU for the real-data comparison.

The step is the pipeline's: forward in training mode, the reader's own targets (``training_targets``), the
span loss, backward, clip 5, Adam with lr 0 (every timed call is the same step). Speedups are over QANet
(> 1: the baseline's step is faster); each reader's result is checked against the same reader in float64.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from fastqa.models.lstm_readers import LSTMReader, LSTMReaderConfig
from fastqa.models.qanet import QANet, QANetConfig
from fastqa.tasks.qa import span_loss

from .cases_qanet import CHAR_VOCAB, MAX_WORD_LEN, WORD_VOCAB, make_batch
from .registry import Case, Prepared, _fastqa_backends, register

BASELINES = ("lstm", "lstm-attention", "lstm-pointer")
PRESETS = {"paper": ("paper", "base"), "small": ("small", "small")}  # case -> (QANet preset, baselines' preset)


def build_reader(name: str, preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """QANet (``name`` "qanet", fast layers) or a baseline, with the benchmark vocabularies, seeded weights."""
    torch.manual_seed(seed)
    if name == "qanet":
        model: nn.Module = QANet(QANetConfig.from_preset(preset, word_vocab_size=WORD_VOCAB, char_vocab_size=CHAR_VOCAB),
                                 "fast")
    else:
        model = LSTMReader(LSTMReaderConfig.from_preset(preset, variant=name, word_vocab_size=WORD_VOCAB))
    return model.to(device=device, dtype=dtype)


def reader_train_step(model: nn.Module, batch: dict[str, torch.Tensor], *, seed: int = 0
                      ) -> Callable[[], torch.Tensor]:
    """The pipeline's train step on ``batch`` (lr 0; the RNG re-seeded at each call: same dropout) -> the loss."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=0.0, betas=(0.8, 0.999), eps=1e-7, weight_decay=3e-7)
    inputs = (batch["context_words"], batch["context_chars"], batch["question_words"], batch["question_chars"])
    starts, ends = model.training_targets(batch["context_words"], batch["start"], batch["end"])

    def step() -> torch.Tensor:
        torch.manual_seed(seed)
        opt.zero_grad(set_to_none=True)
        log_s, log_e = model(*inputs)
        loss = span_loss(log_s, log_e, starts, ends)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        return loss.detach()
    return step


@dataclass
class ReadersTrainStepCase(Case):
    """QANet's train step beside the three baselines' (see the module docstring)."""
    model_case = True
    preset: str
    B: int
    n: int = 400
    m: int = 50
    op: str = "qa_readers"
    name: str = ""
    shape: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = ("fwd+bwd",)
    quick: bool = False

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {self.preset!r}")
        self.name = self.name or f"{self.preset}_B{self.B}_n{self.n}_m{self.m}"
        qanet, lstm = PRESETS[self.preset]
        self.shape = {"B": self.B, "n": self.n, "m": self.m, "W": MAX_WORD_LEN, "qanet": qanet, "baselines": lstm}

    def prepare(self, mode: str, device: torch.device, dtype: torch.dtype, *, compile: bool,
                naive_limit_bytes: float) -> Prepared:
        qanet_preset, lstm_preset = PRESETS[self.preset]
        batch = make_batch(torch.Generator().manual_seed(0), self.B, self.n, self.m)
        on_device = {k: v.to(device) for k, v in batch.items()}
        names = list(BASELINES)
        unavailable = {"compiled": "not offered for the model cases"}
        backends, why = _fastqa_backends(device)
        if backends:
            names.insert(0, "qanet")
        else:  # QANet on its fast layers needs a fastqa backend; the baselines run without one
            unavailable["qanet"] = why or "no fastqa backend"
        runners, expected, flops, param_bytes = {}, {}, 0.0, 0
        for name in names:
            preset = qanet_preset if name == "qanet" else lstm_preset
            truth = build_reader(name, preset, device, torch.float64)
            expected[name] = reader_train_step(truth, on_device)()
            del truth
            model = build_reader(name, preset, device, dtype)
            runners[name] = reader_train_step(model, on_device)
            param_bytes = max(param_bytes, sum(p.numel() for p in model.parameters() if p.requires_grad))
        # No single FLOP count fits four models: the bound is reading the largest reader's weights, grads and
        # Adam's two states once.
        return Prepared(runners=runners, expected=expected, flops=flops,
                        bytes=float(8 * param_bytes * dtype.itemsize), unavailable=unavailable, baseline="qanet")


READERS_CASES: list[Case] = [ReadersTrainStepCase("small", 32), ReadersTrainStepCase("paper", 32),
                             ReadersTrainStepCase("small", 4, n=60, m=12, quick=True)]

if __name__ != "__main__":  # run as a script, _main imports the module itself (registering once)
    for _case in READERS_CASES:
        register(_case)


def _main(argv: list[str]) -> int:
    import benchmarks.cases_readers  # noqa: F401  (registers the cases)
    from benchmarks.__main__ import main
    return main(["--ops", "qa_readers", *argv])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
