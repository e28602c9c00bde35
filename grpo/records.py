"""Typed records passed between the stages of a GRPO step.

- `Rollout` is the trainer's own record of a step's samples: flat, one entry
  per sample, rewards and log-probs as tensors, so nothing is converted
  between lists and tensors on the way from rewards to the loss.
- `ExperienceBatch` is the framework API's public record (lists grouped per state);
  it is built only where the public API returns one
  (`ExperienceCollector.collect_experiences`).

In both, sample n = i * G + j is action j of state i. Rewards and advantages
are never stored in the same field.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["ExperienceBatch", "Rollout"]


class Rollout(NamedTuple):
    """The N = B * G samples of a step, flat (sample n = i * G + j)."""

    states: list[Any]  # (N,) the state of each sample: each of the B states G times
    actions: list[Any]  # (N,)
    rewards: Tensor  # (N,) float32
    advantages: Tensor | None = None  # (N,) float32; None until computed
    old_logprobs: Tensor | None = None  # (N, T) float32 log π_old; None = on-policy (not recorded)
    completion_mask: Tensor | None = None  # (N, T) bool, True = counted; recorded with old_logprobs
    token_counts: Tensor | None = None  # (N,) long: positions the loss counts; None = unknown
    # (N, T') float32 log π_sampler: the sampler's own log-probs of samples drawn with older
    # weights than the trainer's (overlapped rollouts, grpo.run.overlap); None = not stale
    sampler_logprobs: Tensor | None = None

    @property
    def num_samples(self) -> int:
        return len(self.actions)

    def take(self, idx: Tensor) -> Rollout:
        """Samples idx (n,) of this rollout, in that order."""
        rows = idx.tolist()

        def pick(tensor: Tensor | None) -> Tensor | None:
            return None if tensor is None else tensor[idx.to(tensor.device)]

        return Rollout(
            states=[self.states[n] for n in rows],
            actions=[self.actions[n] for n in rows],
            rewards=self.rewards[idx],
            advantages=pick(self.advantages),
            old_logprobs=pick(self.old_logprobs),
            completion_mask=pick(self.completion_mask),
            token_counts=pick(self.token_counts),
            sampler_logprobs=pick(self.sampler_logprobs),
        )

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """The samples of several rollouts, in order (fields recorded in every part only)."""

        def cat(name: str) -> Tensor | None:
            tensors = [getattr(p, name) for p in parts]
            return None if any(t is None for t in tensors) else torch.cat(tensors)

        return Rollout(
            states=[s for p in parts for s in p.states],
            actions=[a for p in parts for a in p.actions],
            rewards=torch.cat([p.rewards for p in parts]),
            advantages=cat("advantages"),
            old_logprobs=cat("old_logprobs"),
            completion_mask=cat("completion_mask"),
            token_counts=cat("token_counts"),
            sampler_logprobs=cat("sampler_logprobs"),
        )

    def to_experience_batch(self, group_size: int, token_level: bool = True) -> ExperienceBatch:
        """The framework API's grouped record of these samples (B = N / group_size states);
        `token_level` False (a per-action policy) leaves out the (N, 1) per-token fields."""
        G = group_size
        B = self.num_samples // G
        old = None
        if self.old_logprobs is not None:
            counted = torch.where(self.completion_mask, self.old_logprobs, 0.0)  # (N, T)
            old = counted.sum(-1).view(B, G).tolist()  # (B, G) log π_old of whole actions
        return ExperienceBatch(
            states=self.states[::G],
            action_groups=[self.actions[i * G : (i + 1) * G] for i in range(B)],
            reward_groups=self.rewards.view(B, G).tolist(),
            log_prob_old_groups=old,
            old_token_logprobs=self.old_logprobs if token_level else None,
            completion_mask=self.completion_mask if token_level else None,
        )


class ExperienceBatch(NamedTuple):
    """One rollout in the framework API's layout: B states, G actions each, state-major."""

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

    def to_rollout(self) -> Rollout:
        """The flat record of these samples (old per-action log-probs become (N, 1))."""
        old, mask = self.old_token_logprobs, self.completion_mask
        if old is None and self.log_prob_old_groups is not None:
            old = torch.tensor(self.log_prob_old_groups, dtype=torch.float32).reshape(-1, 1)
            mask = torch.ones_like(old, dtype=torch.bool)  # (N, 1): the action is one "token"
        return Rollout(
            states=self.flat_states(),
            actions=self.flat_actions(),
            rewards=torch.tensor(self.flat_rewards(), dtype=torch.float32),
            old_logprobs=old,
            completion_mask=mask,
        )
