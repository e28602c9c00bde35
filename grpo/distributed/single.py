"""`SingleProcess`: the one-process counterpart of `DataParallel`, with the same methods.

The trainer talks to one of the two and never asks which: here the shard is
everything, gathering returns what it is given, every sample is owned, and
checkpoints hold the plain state dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from grpo import checkpoint

__all__ = ["SingleProcess"]


class SingleProcess:
    """A step in one process: no sharding, no collectives."""

    rank = 0
    world_size = 1

    def shard_states(self, states: Sequence[Any]) -> list[Any]:
        return list(states)

    def gather(self, local: Tensor) -> Tensor:
        return local

    def gather_objects(self, local: Any) -> list[Any]:
        return [local]

    def own(self, idx: Tensor, num_local: int) -> tuple[Tensor, Tensor, float]:
        return idx, idx, 1.0

    def backward(
        self,
        compute: Callable[[], dict[str, Any]],
        weight: float,
        sync: bool,
        scale: Callable[[Tensor], Tensor] = lambda loss: loss,
    ) -> dict[str, Any]:
        """Run `compute` (-> loss dict) and backpropagate weight·loss (`scale`d last)."""
        loss_dict = compute()
        scale(loss_dict["total_loss"] * weight).backward()
        return loss_dict

    def all_true(self, flag: bool) -> bool:
        return flag

    def sum_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return sums

    def copy_policy(self, policy: Any) -> Any:
        return copy.deepcopy(policy)

    def model_state(self, policy: Any) -> dict[str, Tensor]:
        return checkpoint.model_state(policy)

    def load_model_state(self, policy: Any, state: dict[str, Tensor]) -> None:
        checkpoint.load_model_state(policy, state)

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: Any, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)
