"""`DataParallel`: one rank's shard of a step, its wrapped model and its collectives.

The scheme is described in the package docstring (`grpo.distributed`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as dcp
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh

from grpo import checkpoint
from grpo.distributed.process_group import all_gather, collective_device, shard_bounds

__all__ = [
    "DataParallel",
    "DistributedConfig",
    "accumulate",
    "accumulate_metrics",
    "policy_module",
]

STRATEGIES = ("ddp", "fsdp2")
# loss-dict entries that are shares of a global mini-batch (sum over ranks = its value)
SHARE_KEYS = frozenset(("total_loss", "policy_loss", "kl_penalty", "entropy_bonus"))
SHARE_KEYS |= {"loss/policy", "loss/kl", "loss/entropy"}
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class DistributedConfig:
    """How a multi-process run shares the policy across ranks."""

    strategy: str = "ddp"
    """"ddp": replicate the model, all-reduce gradients; "fsdp2": shard parameters,
    gradients and optimizer state with `torch.distributed.fsdp.fully_shard`."""
    find_unused_parameters: bool = False
    """DDP: allow trainable parameters that get no gradient in a step (slower)."""
    fsdp_shard_modules: tuple[str, ...] | None = None
    """FSDP2: class names of submodules sharded as units of their own (e.g.
    ("Qwen2DecoderLayer",)); None = the model's `_no_split_modules` if it has them."""
    fsdp_reshard_after_forward: bool = True
    """FSDP2: free gathered parameters after forward (less memory, one more all-gather)."""
    fsdp_param_dtype: str | None = None
    """FSDP2 mixed precision: compute dtype of gathered parameters ("bfloat16",
    "float16", "float32"); None = as stored."""
    fsdp_reduce_dtype: str | None = None
    """FSDP2: dtype of the gradient reduce-scatter; None = the compute dtype."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}"
            )
        for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in _DTYPES:
                raise ValueError(
                    f"{name} must be None or one of {', '.join(_DTYPES)}; got {value!r}"
                )


# ------------------------------------------------------------ model wrapping
def policy_module(policy: Any) -> nn.Module:
    """The `nn.Module` holding every trainable parameter: the policy or its `.model`."""
    module = policy if isinstance(policy, nn.Module) else getattr(policy, "model", None)
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"policy: data-parallel training needs an nn.Module policy or one with an nn.Module "
            f"`.model`; got {type(policy).__name__}"
        )
    owned = {id(p) for p in module.parameters()}
    stray = [name for name, p in policy.get_parameters().items() if id(p) not in owned]
    if stray:
        raise TypeError(
            f"policy: parameters {stray} are not parameters of {type(module).__name__}; "
            "register them in the module so that they can be synchronised"
        )
    return module


class _LossRunner(nn.Module):
    """Owns the policy's module; its forward is a whole loss computation (see module doc)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, compute: Callable[[], Any]) -> Any:
        return compute()


def _shard(module: nn.Module, config: DistributedConfig) -> None:
    """fully_shard the chosen submodules, then the root (FSDP2's recommended order)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # torch >= 2.6

    names = config.fsdp_shard_modules
    if names is None:
        names = tuple(getattr(module, "_no_split_modules", None) or ())
    dtypes = _DTYPES.get(config.fsdp_param_dtype), _DTYPES.get(config.fsdp_reduce_dtype)
    options = {
        "reshard_after_forward": config.fsdp_reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=dtypes[0], reduce_dtype=dtypes[1]),
        # explicit: FSDP2's default mesh is on CUDA whenever CUDA exists, even under gloo
        "mesh": init_device_mesh(collective_device().type, (dist.get_world_size(),)),
    }
    for sub in list(module.modules())[1:]:
        if type(sub).__name__ in names:
            fully_shard(sub, **options)
    fully_shard(module, **options)


class DataParallel:
    """One process's part of a data-parallel run: its shard, collectives and wrapped model.

    Build it before the optimizer: FSDP2 replaces the parameters with sharded ones.
    """

    def __init__(self, policy: Any, config: DistributedConfig | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs a process group: call init_from_env() first")
        self.config = DistributedConfig() if config is None else config
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.module = policy_module(policy)
        if self.config.strategy == "ddp":
            ddp = nn.parallel.DistributedDataParallel
            # forwards outside the runner (generation) need no collective (renamed in 2.13)
            new = "forward_sync_buffers" in inspect.signature(ddp).parameters
            no_buffer_sync = {"forward_sync_buffers" if new else "broadcast_buffers": False}
            on_gpu = collective_device().type == "cuda"
            self._ddp = ddp(
                _LossRunner(self.module),  # broadcasts rank 0's weights to every rank
                device_ids=[torch.cuda.current_device()] if on_gpu else None,
                find_unused_parameters=self.config.find_unused_parameters,
                **no_buffer_sync,
            )
        else:
            with torch.no_grad():  # start every shard from rank 0's weights, as DDP does
                for tensor in self.module.state_dict().values():
                    dist.broadcast(tensor, 0)
            self._blueprint = copy.deepcopy(policy)  # made weightless, for `copy_policy`
            policy_module(self._blueprint).to("meta")
            _shard(self.module, self.config)
            self._ddp = None

    # ------------------------------------------------------------------ data
    def shard_states(self, states: Sequence[Any]) -> list[Any]:
        """This rank's contiguous block of the global states (S must divide by W)."""
        start, stop = shard_bounds(len(states), self.rank, self.world_size)
        return list(states[start:stop])

    def gather(self, local: Tensor) -> Tensor:
        """Every rank's (n, ...) values (rewards, token counts) -> (W·n, ...) in global order."""
        return all_gather(local)

    def gather_objects(self, local: Any) -> list[Any]:
        """Every rank's picklable `local` (a rollout of its shard) -> a list in rank order."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, local)
        return gathered

    def own(self, idx: Tensor, num_local: int) -> tuple[Tensor, Tensor, float]:
        """Of global samples idx (n,): those this rank holds (it holds `num_local`, in order),
        their local rows, and a loss scale.

        A rank holding none of them gets its first sample with scale 0 (see module doc).
        """
        start = self.rank * num_local
        owned = idx[(idx >= start) & (idx < start + num_local)]  # keeps the global order
        if len(owned) == 0:
            return idx.new_tensor([start]), idx.new_tensor([0]), 0.0
        return owned, owned - start, 1.0

    # ------------------------------------------------------------- training
    def backward(
        self,
        compute: Callable[[], dict[str, Any]],
        weight: float,
        sync: bool,
        scale: Callable[[Tensor], Tensor] = lambda loss: loss,
    ):
        """Run `compute` (-> loss dict) through the wrapper and backpropagate weight·W·loss.

        `scale` is applied last (a gradient scaler's factor, for fp16).

        DDP and FSDP2 average gradients over ranks; the factor W undoes that, so the
        summed shares give the single-process gradient. `sync` False accumulates locally.
        """
        with self._gradient_sync(sync):
            loss_dict = self._ddp(compute) if self._ddp is not None else compute()
            scale(loss_dict["total_loss"] * (weight * self.world_size)).backward()
        return loss_dict

    def _gradient_sync(self, sync: bool) -> contextlib.AbstractContextManager:
        if self._ddp is None:  # FSDP2: a flag, not a context
            self.module.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if sync else self._ddp.no_sync()

    def all_true(self, flag: bool) -> bool:
        """True only if `flag` is True on every rank (so all ranks skip a step together)."""
        value = torch.tensor([float(flag)], device=collective_device())
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return value.item() == 1.0

    def sum_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Sum metric totals over ranks (keys missing on a rank count as 0)."""
        gathered: list[dict[str, float]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, dict(sums))
        keys = sorted(set().union(*gathered))
        return {key: sum(part.get(key, 0.0) for part in gathered) for key in keys}

    # ------------------------------------------------- reference, checkpoints
    def copy_policy(self, policy: Any) -> Any:
        """A copy of the policy with its own weights (FSDP2: sharded like the policy's)."""
        if self._ddp is not None:
            return copy.deepcopy(policy)
        # FSDP2 modules cannot be deep-copied: shard a weightless copy, then fill its shards
        twin = copy.deepcopy(self._blueprint)
        module = policy_module(twin)
        _shard(module, self.config)
        module.to_empty(device=next(self.module.parameters()).device)
        with torch.no_grad():
            for mine, theirs in zip(module.parameters(), self.module.parameters(), strict=True):
                mine.copy_(theirs)  # shard to shard, same placements
            for mine, theirs in zip(module.buffers(), self.module.buffers(), strict=True):
                mine.copy_(theirs)
        return twin

    def model_state(self, policy: Any) -> dict[str, Tensor]:
        """The full (unsharded) state dict of a policy, complete on rank 0; call on every rank."""
        if self._ddp is not None:  # replicas: every rank holds the full state
            return checkpoint.model_state(policy)
        options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dcp.get_model_state_dict(policy_module(policy), options=options)

    def load_model_state(self, policy: Any, state: dict[str, Tensor]) -> None:
        """Load a full state dict (written by any world size) into this rank's policy."""
        if self._ddp is not None:
            checkpoint.load_model_state(policy, state)
            return
        options = dcp.StateDictOptions(full_state_dict=True)
        dcp.set_model_state_dict(policy_module(policy), state, options=options)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`Optimizer.state_dict()` layout with full tensors, complete on rank 0."""
        if self._ddp is not None:
            return optimizer.state_dict()
        options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        named = dcp.get_optimizer_state_dict(self.module, optimizer, options=options)
        if self.rank != 0:  # cpu_offload leaves other ranks empty
            return named
        # name-keyed -> index-keyed, the layout any world size and one process load
        index = {name: i for i, name in enumerate(_param_names(self.module, optimizer))}
        return {
            "state": {index[name]: values for name, values in named["state"].items()},
            "param_groups": [
                {**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]
            ],
        }

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Inverse of `optimizer_state`, on every rank."""
        if self._ddp is not None:
            optimizer.load_state_dict(state)
            return
        names = _param_names(self.module, optimizer)
        named = {
            "state": {names[i]: values for i, values in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
        options = dcp.StateDictOptions(full_state_dict=True)
        dcp.set_optimizer_state_dict(self.module, optimizer, named, options=options)


def _param_names(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's index order (groups in order, params in order)."""
    names = {id(p): name for name, p in module.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def accumulate(sums: dict[str, float], loss_dict: dict[str, Any], weight: int) -> None:
    """Add weight * value for every scalar entry of a loss dict."""
    for key, value in loss_dict.items():
        if isinstance(value, Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        if isinstance(value, (int, float)):
            sums[key] += weight * float(value)


def accumulate_metrics(
    sums: dict[str, float], loss_dict: dict[str, Any], num_local: int, num_global: int
) -> None:
    """Add a mini-batch's scalars: shares weighted by the global mini-batch size, per-rank
    means by the local sample count; `sum_metrics` then sums over ranks (in one process both
    counts are the mini-batch's size)."""
    accumulate(sums, {k: v for k, v in loss_dict.items() if k in SHARE_KEYS}, num_global)
    accumulate(sums, {k: v for k, v in loss_dict.items() if k not in SHARE_KEYS}, num_local)
