"""Typed records passed between the stages of a GRPO step.

`ExperienceBatch` keeps seed 004's four fields first (lists of Python values,
grouped per state); token-level policies add per-token tensors after them.
Rewards and advantages are never stored in the same field.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

__all__ = ["ExperienceBatch"]


class ExperienceBatch(NamedTuple):
    """One rollout: B states, G actions each, flattened order is state-major.

    Sample n = i * G + j is action j of state i.
    """

    states: list[Any]  # (B,)
    action_groups: list[list[Any]]  # (B, G)
    reward_groups: list[list[float]]  # (B, G)
    # (B, G), summed over tokens for token policies; None = not recorded: the loss takes
    # the detached current log-probs as π_old (on-policy, ratio 1)
    log_prob_old_groups: list[list[float]] | None
    old_token_logprobs: Tensor | None = None  # (N, T) for token-level policies, else None
    completion_mask: Tensor | None = None  # (N, T) bool, True = counted by the loss

    @property
    def group_size(self) -> int:
        return len(self.action_groups[0]) if self.action_groups else 0

    @property
    def num_samples(self) -> int:
        return sum(len(group) for group in self.action_groups)

    def flat_states(self) -> list[Any]:
        """(N,) each state repeated once per action, in sample order."""
        return [s for s, group in zip(self.states, self.action_groups, strict=True) for _ in group]

    def flat_actions(self) -> list[Any]:
        """(N,) actions in sample order."""
        return [a for group in self.action_groups for a in group]

    def flat_rewards(self) -> list[float]:
        """(N,) rewards in sample order."""
        return [r for group in self.reward_groups for r in group]
