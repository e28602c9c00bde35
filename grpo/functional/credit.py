"""An RL algorithm as a credit assigner plus a loss (seed 003, "Algorithm = CreditAssigner + Loss").

A credit assigner turns per-sample rewards into per-sample weights (N,); a
loss turns per-token log-probs and those weights into one number. Composing
them gives the classic algorithms:

    GRPO      = group_normalized + reinforce    (seed 003; Shao et al. 2024)
    REINFORCE = monte_carlo      + reinforce    (Williams 1992)
    SFT       = constant         + cross_entropy

Every formula lives in `advantages.py` or `losses.py`; this module only wires
them. Departures from seed 003: rewards may be per step (N, S), summed into a
(optionally discounted) return from the first step; SFT's cross-entropy is the
REINFORCE loss with weight 1 on every sample (-log π of the data), aggregated
per token by default as supervised fine-tuning usually is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from grpo.functional._checks import check_tensor, lookup
from grpo.functional.advantages import group_advantages
from grpo.functional.losses import policy_loss

__all__ = ["ALGORITHMS", "CREDIT_ASSIGNERS", "LOSSES", "Algorithm", "compose", "returns"]


def returns(rewards: Tensor, gamma: float = 1.0) -> Tensor:
    """Return from the first step: (N,) -> (N,) as is, (N, S) -> Σ_s γ^s r_s (N,).

    Steps after an episode ended should hold 0 reward.
    """
    check_tensor(rewards, "rewards")
    if rewards.dim() not in (1, 2) or rewards.numel() == 0:
        raise ValueError(f"rewards: got shape {tuple(rewards.shape)}; allowed: (N,) or (N, S)")
    if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma: got {gamma!r}; allowed: a number in [0, 1]")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards: got a non-finite value; allowed: finite values")
    if rewards.dim() == 1:
        return rewards  # (N,) one reward per sample is already its return
    steps = torch.arange(rewards.shape[1], dtype=rewards.dtype, device=rewards.device)  # (S,)
    return (rewards * gamma**steps).sum(dim=1)  # (N,)


def _group_normalized(rewards: Tensor, *, group_size: int, gamma: float = 1.0, **options) -> Tensor:
    # options: baseline, scale, eps, positive_only of group_advantages
    return group_advantages(returns(rewards, gamma), group_size, **options)


def _monte_carlo(rewards: Tensor, *, gamma: float = 1.0) -> Tensor:
    return returns(rewards, gamma)


def _constant(rewards: Tensor) -> Tensor:
    check_tensor(rewards, "rewards")
    return torch.ones(rewards.shape[0], device=rewards.device)  # (N,)


CREDIT_ASSIGNERS: dict[str, Callable[..., Tensor]] = {
    "group_normalized": _group_normalized,
    "monte_carlo": _monte_carlo,
    "constant": _constant,
}
"""name -> fn(rewards (N,) or (N, S), **options) -> weights (N,)."""

LossFn = Callable[..., "tuple[Tensor, dict[str, Tensor]]"]


def _reinforce(logprobs, weights, completion_mask, old_logprobs=None, **options):
    return policy_loss(
        logprobs, old_logprobs, weights, completion_mask, loss_type="reinforce", **options
    )


def _clipped(logprobs, weights, completion_mask, old_logprobs=None, **options):
    return policy_loss(
        logprobs, old_logprobs, weights, completion_mask, loss_type="clipped", **options
    )


def _cross_entropy(logprobs, weights, completion_mask, old_logprobs=None, aggregation="token_mean"):
    # -w·log π aggregated: with unit weights, the negative log-likelihood of the data
    loss, stats = policy_loss(
        logprobs, None, weights, completion_mask, loss_type="reinforce", aggregation=aggregation
    )
    return loss, {"loss/policy": stats["loss/policy"]}


LOSSES: dict[str, LossFn] = {
    "reinforce": _reinforce,
    "clipped": _clipped,
    "cross_entropy": _cross_entropy,
}
"""name -> fn(logprobs (N, T), weights (N,), completion_mask, old_logprobs, **options)
-> (loss, stats); options are `policy_loss` keywords (aggregation, eps_low, beta, ...)."""


@dataclass(frozen=True)
class Algorithm:
    """A credit assigner and a loss, applied one after the other."""

    credit: str
    """Name in `CREDIT_ASSIGNERS`: rewards -> per-sample weights."""
    loss: str
    """Name in `LOSSES`: (logprobs, weights, completion_mask) -> (loss, stats)."""
    credit_options: Mapping[str, Any] = field(default_factory=dict)
    """Keywords for the credit assigner, e.g. {"group_size": 4} or {"gamma": 0.99}."""
    loss_options: Mapping[str, Any] = field(default_factory=dict)
    """Keywords for the loss, e.g. {"aggregation": "token_mean"}."""

    def __post_init__(self) -> None:
        lookup(CREDIT_ASSIGNERS, self.credit, "credit")
        lookup(LOSSES, self.loss, "loss")
        if self.credit == "group_normalized" and "group_size" not in self.credit_options:
            raise ValueError("credit_options: 'group_normalized' needs {'group_size': G}, G >= 2")

    def assign_credit(self, rewards: Tensor) -> Tensor:
        """Per-sample weights (N,) from rewards (N,) or (N, S)."""
        return CREDIT_ASSIGNERS[self.credit](rewards, **self.credit_options)

    def __call__(
        self,
        logprobs: Tensor,
        rewards: Tensor,
        completion_mask: Tensor,
        old_logprobs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """(loss, stats) from log-probs (N, T), rewards (N,) or (N, S) and the mask (N, T)."""
        weights = self.assign_credit(rewards).to(logprobs.device)  # (N,)
        loss_fn = LOSSES[self.loss]
        return loss_fn(logprobs, weights, completion_mask, old_logprobs, **self.loss_options)


def compose(
    credit: str,
    loss: str,
    credit_options: Mapping[str, Any] | None = None,
    loss_options: Mapping[str, Any] | None = None,
) -> Algorithm:
    """`Algorithm(credit, loss, ...)`: e.g. compose("group_normalized", "reinforce", {"group_size": 4})."""
    return Algorithm(credit, loss, dict(credit_options or {}), dict(loss_options or {}))


ALGORITHMS: dict[str, tuple[str, str]] = {
    "grpo": ("group_normalized", "reinforce"),
    "reinforce": ("monte_carlo", "reinforce"),
    "sft": ("constant", "cross_entropy"),
}
"""name -> (credit, loss): the named compositions, for `compose(*ALGORITHMS[name], ...)`."""
