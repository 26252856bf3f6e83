"""A tiny regression Task for testing the shared training loop (and a script torchrun can launch).

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/toy_task.py OUT STEPS
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from fastqa.data.batching import bucket_batches
from fastqa.train import TrainSettings, fit, log_warmup, seed_everything


class ToyTask:
    """y = sin(x·w) regression with an MLP; examples have 'lengths' so the bucketing is exercised."""

    kind = "toy"

    def __init__(self, *, n: int = 96, dim: int = 6, batch_size: int = 8, dropout: float = 0.1, seed: int = 0,
                 hidden: int = 16) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.sin(self.x @ torch.randn(dim, 1, generator=g))
        self.lengths = torch.randint(1, 20, (n,), generator=g).tolist()
        self.batch_size, self.seed, self.hidden, self.dropout = batch_size, seed, hidden, dropout
        seed_everything(seed)
        self.model = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def train_batches(self, epoch: int) -> list[list[int]]:
        return bucket_batches(self.lengths, self.batch_size, seed=self.seed, epoch=epoch, pool=2)

    def collate(self, indices, device):
        return self.x[indices].to(device), self.y[indices].to(device)

    def loss(self, model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean()

    def configure_optimizer(self, model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.999), eps=1e-7, weight_decay=3e-7)
        return opt, log_warmup(opt, 10)

    def evaluate(self, model):
        return {"dev_loss": float(((model(self.x) - self.y) ** 2).mean())}

    def checkpoint_meta(self):
        return {"config": {"hidden": self.hidden, "dropout": self.dropout}}


if __name__ == "__main__":  # the torchrun entry of the distributed test
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    fit(ToyTask(dropout=0.0), TrainSettings(out_dir=out, max_steps=steps, clip_norm=5.0, ema_decay=0.99,
                                            eval_every=0, progress=False))
