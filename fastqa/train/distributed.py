"""torchrun / DistributedDataParallel set-up: nothing home-made, just the engine PyTorch users run.

``torchrun --nproc_per_node N fastqa qa-train ...`` sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR in
the environment; ``init_distributed`` joins the process group (NCCL on GPUs, gloo on the CPU). Without
those variables it is a single process and every helper here is a no-op.

A rank that dies (killed, out of memory) closes its connections, and the next collective of every other rank
fails at once with gloo's "Connection closed by peer" (NCCL's watchdog reports it likewise). ``fit`` turns that
into ``RankLost``: one line naming the rank that is gone (``lost_ranks``: a roll call through torchrun's
store -- a rank that does not answer within a few seconds is the one lost), and the process exits; torchrun's
agent stops the remaining ranks too. Under ``torchrun --max-restarts N`` the agent then starts every rank
again (``restart_count`` > 0) and ``fit`` resumes from the run's last checkpoint by itself.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DistEnv", "default_device", "init_distributed", "wrap_ddp", "barrier", "all_gather_object", "any_true", "max_each",
           "shutdown", "RankLost", "restart_count", "is_peer_failure", "lost_ranks", "rank_lost"]

ROLL_CALL_S = 3.0  # how long a surviving rank waits for the others to answer the roll call
# What a collective says when a peer's process is gone or stopped answering (gloo, NCCL, the TCP store).
_PEER_FAILURES = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
                  "socket timeout", "nccl communicator was aborted", "remote process exited")


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


def default_device(device: str | torch.device | None = None) -> torch.device:
    """The one device rule, for training and inference alike: ``device``, or where none is given a CUDA GPU when
    there is one, else the CPU. Under torchrun (``LOCAL_RANK`` set) a CUDA device without an index is this rank's
    own GPU, so that the ranks of one machine do not all land on the first."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def init_distributed(device: str | torch.device | None = None) -> DistEnv:
    """Join torchrun's process group if there is one, on ``device`` (``default_device``: this rank's GPU under
    NCCL)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = default_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if restart_count() > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent keeps its store across restarts, and the keys the previous attempt's process group
            # wrote there are still in it: a restarted rank could read a dead rank's address from them and fail
            # to connect. A prefix per attempt keeps each attempt's keys apart.
            agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                        is_master=False)
            store = dist.PrefixStore(f"fastqa/attempt-{restart_count()}", agent_store)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size)
        else:
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


class RankLost(ConnectionError):
    """Another rank of this distributed run is gone; ``str()`` is the one line to print (an ``OSError``: the
    command prints it as one line and exits with a non-zero status)."""

    def __init__(self, message: str, lost: list[int] | None) -> None:
        super().__init__(message)
        self.lost = lost

    def __str__(self) -> str:
        return str(self.args[0])


def restart_count() -> int:
    """How many times torchrun's agent has restarted this run's ranks (``--max-restarts``); 0 outside torchrun."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error``, raised by a collective, says that another rank is gone or stopped answering."""
    if isinstance(error, getattr(dist, "DistNetworkError", ())):
        return True
    return isinstance(error, RuntimeError) and any(p in str(error).lower() for p in _PEER_FAILURES)


def lost_ranks(env: DistEnv, wait_s: float = ROLL_CALL_S) -> list[int] | None:
    """The ranks that do not answer a roll call through the process group's store within ``wait_s`` seconds
    (every surviving rank calls this when a collective fails, so the survivors answer each other); None when
    the store cannot be reached."""
    if env.world_size == 2:
        return [1 - env.rank]  # the one other rank: no roll call needed
    try:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"fastqa/roll-call/{restart_count()}/"
        store.set(f"{prefix}{env.rank}", "here")
        missing = [r for r in range(env.world_size) if r != env.rank]
        deadline = time.monotonic() + wait_s
        while True:
            missing = [r for r in missing if not store.check([f"{prefix}{r}"])]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the store went with the failure: the line says "another rank"
        return None


def rank_lost(env: DistEnv, error: BaseException, out_dir: str) -> RankLost:
    """The one-line error of a rank whose collective failed because another rank is gone."""
    lost = lost_ranks(env)
    who = (f"rank {', '.join(map(str, lost))}" if lost else "another rank") + f" of {env.world_size}"
    # gloo's message opens with its source location in brackets and ends with advice: keep its first sentence.
    reason = str(error).strip().split("] ", 1)[-1].split(". ")[0].rstrip(".") or type(error).__name__
    return RankLost(f"rank {env.rank}: {who} is gone ({reason}); stopping -- {out_dir} keeps the last checkpoint: "
                    "resume with --resume (torchrun --max-restarts resumes by itself)", lost)
