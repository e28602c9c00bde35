"""Data-parallel GRPO on PyTorch's own engine: torchrun, DDP by default, FSDP2 on request.

Every process of `torchrun --nproc-per-node W` builds the same trainer and calls
`train_step` with the same global list of S states. A step then maps onto W
processes so that it computes what one process would (docs/distributed.md):

- States: rank r keeps the contiguous block of S / W states starting at r·S/W.
  A group of G actions is sampled and scored whole on the rank of its state, so
  global sample n = i·G + j lives on rank n // (N / W), N = S·G.
- Advantages: the N rewards are all-gathered and every rank computes the
  advantages of the whole batch exactly as one process does, so batch-level
  scaling and the logged reward statistics span all ranks.
- Mini-batches: every rank draws the same permutation of the N global samples
  from the trainer's generator (same seed, same draws); global mini-batch k is
  order[k·M : (k+1)·M] and each rank trains on the samples of it that it owns.
- Loss: each rank backpropagates W times its share Σ_own ℓ / D, where D is the
  whole global mini-batch's denominator (its sequences, or its counted tokens
  from per-sample counts all-gathered once per step). The shares sum to the
  single-process loss; DDP and FSDP2 average over ranks, which W undoes.
- A rank that owns no sample of a mini-batch still runs forward and backward (on
  one of its samples, loss times 0) so every rank joins the same collectives.

Departure from plain DDP usage: DDP wraps a runner around the policy's own module
whose forward is the whole loss computation, so the policy keeps its unwrapped
module (generation, parameter names) and may run several forwards per mini-batch.

Modules: `process_group` (joining the group, this process's rank, collectives;
all of it works in one process too), `data_parallel` (`DataParallel`, the
per-step scheme above) and `single` (`SingleProcess`: the same methods for one
process, so the trainer never asks which it has); `make_parallel` picks one.
"""

from typing import Any

from grpo.distributed.data_parallel import (
    SHARE_KEYS,
    DataParallel,
    DistributedConfig,
    accumulate_metrics,
    policy_module,
)
from grpo.distributed.process_group import (
    barrier,
    init_from_env,
    is_main_process,
    rank,
    scalar,
    shard_bounds,
    shutdown,
    world_size,
)
from grpo.distributed.single import SingleProcess


def make_parallel(policy: Any, config: DistributedConfig | None = None) -> Any:
    """`DataParallel` in a process group of more than one rank, else `SingleProcess`.
    Call before building the optimizer: FSDP2 replaces the parameters."""
    if world_size() > 1:
        return DataParallel(policy, config)
    return SingleProcess()

__all__ = [
    "SHARE_KEYS",
    "DataParallel",
    "DistributedConfig",
    "SingleProcess",
    "accumulate_metrics",
    "barrier",
    "init_from_env",
    "is_main_process",
    "make_parallel",
    "policy_module",
    "rank",
    "scalar",
    "shard_bounds",
    "shutdown",
    "world_size",
]
