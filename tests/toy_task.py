"""A tiny regression Task for testing the shared training loop, and a script that trains it in a process of
its own (what torchrun launches, and what the interruption and reproducibility tests start and signal):

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/toy_task.py OUT STEPS
    python tests/toy_task.py OUT STEPS [--resume] [--gemm] [--dropout P] [--delay S] [--gemm-info FILE]
                                       [--eval-every N]

The script reports a stopped run as the commands do: the one-line message of ``TrainingInterrupted`` and
its exit status (130 SIGINT, 143 SIGTERM); a ``UserError`` or a lost peer rank (``ConnectionError``) as one
line and status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

from helpers import TRAIN_SEED

from fastqa._backend import cpu_gemm_info
from fastqa.data.batching import bucket_batches
from fastqa.errors import UserError
from fastqa.layers import Linear
from fastqa.train import TrainingInterrupted, TrainSettings, fit, log_warmup, seed_everything


class ToyTask:
    """y = sin(x·w) regression with an MLP; examples have 'lengths' so the bucketing is exercised.
    ``delay``: seconds of sleep per training step, so a test can signal a run in the middle; ``seed``: the initial
    weights, batch order and dropout (the tests' ``TRAIN_SEED`` unless given)."""

    kind = "toy"

    def __init__(self, *, n: int = 96, dim: int = 6, batch_size: int = 8, dropout: float = 0.1, seed: int = TRAIN_SEED,
                 hidden: int = 16, delay: float = 0.0) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.sin(self.x @ torch.randn(dim, 1, generator=g))
        self.lengths = torch.randint(1, 20, (n,), generator=g).tolist()
        self.batch_size, self.seed, self.hidden, self.dropout, self.delay = batch_size, seed, hidden, dropout, delay
        seed_everything(seed)
        self.model = self.build(dim)

    def build(self, dim: int) -> nn.Module:
        return nn.Sequential(nn.Linear(dim, self.hidden), nn.ReLU(), nn.Dropout(self.dropout),
                             nn.Linear(self.hidden, 1))

    def train_batches(self, epoch: int) -> list[list[int]]:
        return bucket_batches(self.lengths, self.batch_size, seed=self.seed, epoch=epoch, pool=2)

    def collate(self, indices, device):
        return self.x[indices].to(device), self.y[indices].to(device)

    def loss(self, model, batch):
        if self.delay:
            time.sleep(self.delay)
        x, y = batch
        return ((model(x) - y) ** 2).mean()

    def configure_optimizer(self, model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.999), eps=1e-7, weight_decay=3e-7)
        return opt, log_warmup(opt, 10)

    def evaluate(self, model):
        device = next(model.parameters()).device  # the run's (a CUDA run evaluates there too)
        return {"dev_loss": float(((model(self.x.to(device)) - self.y.to(device)) ** 2).mean())}

    @property
    def eval_size(self) -> int:
        return len(self.x)  # evaluate reads every example

    def checkpoint_meta(self):
        return {"config": {"hidden": self.hidden, "dropout": self.dropout}}


class ToyGemmTask(ToyTask):
    """The toy task on ``fastqa.layers.Linear`` layers wide enough that the CPU kernels time BLAS against
    oneDNN for their products (forward, both gradients, and the evaluation's larger batch): the task on
    which the GEMM engine decisions can change the losses."""

    def __init__(self, **kwargs) -> None:
        super().__init__(hidden=512, **kwargs)

    def build(self, dim: int) -> nn.Module:
        return nn.Sequential(Linear(dim, self.hidden), nn.ReLU(), nn.Dropout(self.dropout),
                             Linear(self.hidden, self.hidden), nn.ReLU(), Linear(self.hidden, 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("steps", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--gemm", action="store_true", help="train ToyGemmTask")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--delay", type=float, default=0.0, help="seconds of sleep per step")
    p.add_argument("--gemm-info", help="write fastqa._backend.cpu_gemm_info() to this JSON file at the end")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate and checkpoint every N steps")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    task = (ToyGemmTask if args.gemm else ToyTask)(dropout=args.dropout, delay=args.delay)
    settings = TrainSettings(out_dir=args.out, max_steps=args.steps, clip_norm=5.0, ema_decay=0.99, eval_every=args.eval_every,
                             log_every=1, progress=False, resume=args.resume)
    try:
        fit(task, settings)
    except TrainingInterrupted as e:
        print(e, file=sys.stderr)
        return e.exit_status
    except (UserError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.gemm_info:
        with open(args.gemm_info, "w", encoding="utf-8") as f:
            json.dump(cpu_gemm_info(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
