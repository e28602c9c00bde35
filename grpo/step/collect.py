"""Rollout and scoring: B states -> B groups of G actions with rewards and old log-probs.

Follows seed 004 section 1: sampling and scoring run under `torch.no_grad()`,
state-action pairs are flattened once (sample n = i * G + j is action j of
state i) and fed to both the policy and the reward model, and every model
output is checked against the shape it must have before anything downstream
sees it.

Departures from seed 004:
- A policy that implements `TokenLevelPolicy` also has its per-token
  log-probabilities and completion mask recorded (`old_token_logprobs`,
  `completion_mask`); `log_prob_old_groups` then holds their masked sums.
- No reusable internal buffers: the flattened lists are locals, freed on return.
- Non-finite rewards are rejected with the offending sample named.
- `record_old_logprobs=False` skips the scoring pass: the batch then has
  `log_prob_old_groups=None` and the loss takes π_old as the detached current
  log-probs. `GRPOTrainer` asks for this only when the two cannot differ (one
  optimizer step on the rollout, sampled by the policy's own scorer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from grpo.protocols import TokenLevelPolicy
from grpo.records import ExperienceBatch

__all__ = ["ExperienceCollector"]


class ExperienceCollector:
    """Samples `group_size` actions per state and records rewards and log π_old."""

    def __init__(self, policy: Any, reward_model: Any, group_size: int) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
        self.policy = policy
        self.reward_model = reward_model
        self.group_size = group_size

    def collect_experiences(
        self, states: Sequence[Any], *, record_old_logprobs: bool = True
    ) -> ExperienceBatch:
        """Roll out and score: (B,) states -> ExperienceBatch with (B, G) groups.

        `record_old_logprobs=False`: no scoring pass; `log_prob_old_groups`,
        `old_token_logprobs` and `completion_mask` are None (see the module docstring).
        """
        if isinstance(states, (str, bytes)):
            raise TypeError(
                f"states must be a list of states, got a single {type(states).__name__}"
            )
        if states is None or len(states) == 0:
            raise ValueError("states must be a non-empty list of states, got an empty one")
        states = list(states)
        B, G = len(states), self.group_size
        # Sampling in eval mode: dropout and similar must not perturb the
        # behaviour policy whose log-probs we record as π_old.
        policy_mode = _enter_eval(self.policy)
        reward_mode = _enter_eval(self.reward_model)
        try:
            with torch.no_grad():
                action_groups = self.policy.generate_actions(states, G)
                action_groups = _check_groups(action_groups, B, G)
                flat_states = [s for s in states for _ in range(G)]  # (N,)
                flat_actions = [a for group in action_groups for a in group]  # (N,)
                seq_logprobs, token_logprobs, mask = None, None, None
                if record_old_logprobs:
                    seq_logprobs, token_logprobs, mask = self._old_logprobs(
                        flat_states, flat_actions
                    )
                rewards = self.reward_model.compute_rewards(flat_states, flat_actions)
                rewards = _check_rewards(rewards, B, G)  # (N,)
        finally:
            _restore_mode(self.policy, policy_mode)
            _restore_mode(self.reward_model, reward_mode)
        return ExperienceBatch(
            states=states,
            action_groups=action_groups,
            reward_groups=rewards.view(B, G).tolist(),
            log_prob_old_groups=None if seq_logprobs is None else seq_logprobs.view(B, G).tolist(),
            old_token_logprobs=token_logprobs,
            completion_mask=mask,
        )

    def _old_logprobs(
        self, flat_states: list[Any], flat_actions: list[Any]
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """log π_old per sample (N,), and per token (N, T) with its mask when available."""
        N = len(flat_states)
        if isinstance(self.policy, TokenLevelPolicy):
            out = self.policy.get_token_log_probabilities(flat_states, flat_actions)
            logprobs = out.logprobs.detach().float()  # (N, T)
            mask = out.completion_mask.detach().bool()  # (N, T)
            if logprobs.dim() != 2 or logprobs.shape[0] != N or mask.shape != logprobs.shape:
                raise ValueError(
                    "get_token_log_probabilities must return logprobs and completion_mask "
                    f"of shape (N, T) with N={N}; got {tuple(logprobs.shape)} and "
                    f"{tuple(mask.shape)}"
                )
            seq_logprobs = logprobs.masked_fill(~mask, 0.0).sum(-1)  # (N,)
            _check_finite(seq_logprobs, "get_token_log_probabilities", self.group_size)
            return seq_logprobs.cpu(), logprobs, mask
        logprobs = torch.as_tensor(self.policy.get_log_probabilities(flat_states, flat_actions))
        if tuple(logprobs.shape) != (N,):
            raise ValueError(
                f"get_log_probabilities must return shape ({N},) for {N} state-action "
                f"pairs; got {tuple(logprobs.shape)}"
            )
        _check_finite(logprobs, "get_log_probabilities", self.group_size)
        return logprobs.detach().float().cpu(), None, None


def _check_groups(action_groups: Any, B: int, G: int) -> list[list[Any]]:
    """generate_actions must return B lists of exactly G actions."""
    if not isinstance(action_groups, Sequence):
        raise TypeError(
            f"generate_actions must return a list of {B} lists of {G} actions, "
            f"got a {type(action_groups).__name__} (convert tensors with .tolist())"
        )
    if len(action_groups) != B:
        raise ValueError(
            f"generate_actions: expected {B} groups (one per state), got {len(action_groups)}"
        )
    groups = []
    for i, group in enumerate(action_groups):
        if not isinstance(group, Sequence) or len(group) != G:
            got = len(group) if isinstance(group, Sequence) else type(group).__name__
            raise ValueError(f"generate_actions: state {i}: expected {G} actions, got {got}")
        groups.append(list(group))
    return groups


def _check_rewards(rewards: Any, B: int, G: int) -> Tensor:
    """compute_rewards must return N = B * G finite numbers, one per pair."""
    rewards = torch.as_tensor(rewards).detach()
    if tuple(rewards.shape) != (B * G,):
        raise ValueError(
            f"compute_rewards must return shape ({B * G},) for {B} states x {G} actions; "
            f"got {tuple(rewards.shape)}"
        )
    rewards = rewards.float().cpu()
    _check_finite(rewards, "compute_rewards", group_size=G)
    return rewards


def _check_finite(values: Tensor, source: str, group_size: int | None = None) -> None:
    bad = (~torch.isfinite(values)).nonzero().flatten()
    if len(bad):
        n = int(bad[0])
        where = f" (state {n // group_size}, action {n % group_size})" if group_size else ""
        raise ValueError(
            f"{source} returned a non-finite value {values[n].item()} for sample {n}{where}; "
            f"{len(bad)} of {len(values)} values are NaN or infinite"
        )


def _enter_eval(model: Any) -> bool | None:
    """Switch to eval mode; return the previous `training` flag (None if unknown)."""
    was_training = getattr(model, "training", None)
    model.eval()
    return was_training if isinstance(was_training, bool) else None


def _restore_mode(model: Any, was_training: bool | None) -> None:
    if was_training:
        model.train()
