"""torchrun / DistributedDataParallel set-up: nothing home-made, just the engine PyTorch users run.

``torchrun --nproc_per_node N fastqa qa-train ...`` sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR in
the environment; ``init_distributed`` joins the process group (NCCL on GPUs, gloo on the CPU). Without
those variables it is a single process and every helper here is a no-op.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DistEnv", "init_distributed", "wrap_ddp", "barrier", "all_gather_object", "any_true", "max_each",
           "shutdown"]


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | torch.device | None = None) -> DistEnv:
    """Join torchrun's process group if there is one; pick the device (this rank's GPU under NCCL)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def wrap_ddp(model: nn.Module, env: DistEnv) -> nn.Module:
    """The model itself in one process, DistributedDataParallel around it under torchrun."""
    if not env.distributed:
        return model
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def all_gather_object(obj: Any, env: DistEnv) -> list:
    if not env.distributed:
        return [obj]
    out: list = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def any_true(flag: bool, env: DistEnv) -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if not env.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def max_each(values: list[float], env: DistEnv) -> list[float]:
    """Each value's maximum over the ranks, in one all-reduce (the loop asks a few questions at every step
    and every rank must get the same answers)."""
    if not env.distributed:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
