"""The process group torchrun describes: joining it, this process's rank, collectives.

Every function works in a single process too (rank 0 of 1), so callers need no
branch for the non-distributed case.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "all_gather",
    "barrier",
    "collective_device",
    "init_from_env",
    "is_main_process",
    "rank",
    "shutdown",
    "scalar",
    "shard_bounds",
    "world_size",
]


_JOINED = {"group": False}  # whether init_from_env created the default group (so shutdown may end it)


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group torchrun describes; False when not launched by torchrun.

    Reads RANK, WORLD_SIZE and LOCAL_RANK. Backend None: "nccl" with CUDA (each
    process on GPU LOCAL_RANK), else "gloo".
    """
    if dist.is_initialized():
        return True
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False
    env = {name: os.environ.get(name, "0") for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    for name, value in env.items():
        if not value.isdigit():
            raise ValueError(f"environment variable {name} must be an integer >= 0, got {value!r}")
    env = {name: int(value) for name, value in env.items()}
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(env["LOCAL_RANK"])
    dist.init_process_group(backend, rank=env["RANK"], world_size=env["WORLD_SIZE"])
    _JOINED["group"] = True
    return True


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main_process() -> bool:
    """True on rank 0 (and in a single process): the one process that writes files."""
    return rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group at the end of a run (a no-op without one): a barrier first, so
    no rank tears its group down while a peer's last collective is still in flight, then
    `destroy_process_group`, so no communication thread is left for interpreter exit.

    Only a group `init_from_env` created is ended: one made by someone else (an in-process
    vLLM engine makes a world of one) is theirs to end, and ending it under them makes
    their own clean-up fail at exit.

    Drop the trainer before calling this. A DDP wrapper holds the group too, and when it is
    the last holder, the group's end comes when the wrapper is freed: that frees gloo's
    worker threads while holding Python's GIL, and a thread still letting go of its last
    collective's tensors waits for that GIL: both wait forever (pytorch/pytorch#56297; about
    one 2-rank run in twelve here). Unreachable wrappers are collected first, while the
    group is still alive."""
    if _JOINED["group"] and dist.is_initialized():
        gc.collect()  # a wrapper kept only by a reference cycle goes now, not after the group
        dist.barrier()
        dist.destroy_process_group()
        _JOINED["group"] = False


def collective_device() -> torch.device:
    """Where collective buffers live: NCCL only moves CUDA tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather(values: Tensor) -> Tensor:
    """Equal-sized (n, ...) tensors of every rank -> (W·n, ...) in rank order, on CPU."""
    values = values.to(collective_device())
    parts = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, values)
    return torch.cat(parts).cpu()


def scalar(value: Any) -> float:
    """A Python float from a tensor, a DTensor (FSDP2 gradient norms) or a number."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)


def shard_bounds(num_items: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous equal block of num_items."""
    if num_items % world_size:
        raise ValueError(
            f"states: got {num_items} states for {world_size} processes; allowed: a multiple "
            f"of the number of processes, so that every rank samples as many groups"
        )
    size = num_items // world_size
    return rank * size, (rank + 1) * size
