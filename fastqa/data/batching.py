"""Length-bucketed batching and padding, shared by both models' data pipelines.

Batches are lists of example indices, a pure function of (lengths, seed, epoch): every rank of a
distributed run computes the same global batches and takes its shard, and a resumed run recomputes the
batches of its epoch and skips those already done -- no sampler state to save.
"""
from __future__ import annotations

import random
from typing import Sequence

import torch

__all__ = ["bucket_batches", "shard", "pad"]


def bucket_batches(lengths: Sequence[int], batch_size: int, *, seed: int, epoch: int = 0, shuffle: bool = True,
                   pool: int = 50, drop_last: bool = False) -> list[list[int]]:
    """Batches of indices into ``lengths`` whose examples have similar lengths (little padding).

    shuffle=True: the indices are shuffled, cut into pools of ``pool * batch_size``, each pool sorted by
    length and cut into batches, and the batch order shuffled -- deterministic in (seed, epoch).
    shuffle=False: all examples sorted by length (stable), in order (evaluation).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if pool < 1:
        raise ValueError(f"pool must be >= 1, got {pool}")
    order = list(range(len(lengths)))
    if not shuffle:
        order.sort(key=lambda i: lengths[i])
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    else:
        rng = random.Random(f"{seed}:{epoch}")  # a string seed hashes stably across processes
        rng.shuffle(order)
        span = pool * batch_size
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start:start + span], key=lambda i: lengths[i])
            batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
        rng.shuffle(batches)
    if drop_last:
        batches = [b for b in batches if len(b) == batch_size]
    return batches


def shard(batch: Sequence[int], rank: int, world_size: int) -> list[int]:
    """This rank's share of a global batch: every ``world_size``-th example starting at ``rank``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return list(batch[rank::world_size])


def pad(seqs: Sequence[Sequence[int]], pad_id: int, *, min_len: int = 1) -> torch.Tensor:
    """Right-padded LongTensor [B, max(len, min_len)] of the id sequences."""
    width = max([min_len, *(len(s) for s in seqs)])
    if not seqs:
        return torch.full((0, width), pad_id, dtype=torch.long)
    # Padded as Python lists and converted once: a tensor per row costs more than the row (a word's characters).
    rows = [(s.tolist() if isinstance(s, torch.Tensor) else list(s)) for s in seqs]
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
