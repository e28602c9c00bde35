"""The GRPO loss for a policy on an `ExperienceBatch` (the framework API).

    L = -E[min(ρ A, clip(ρ, 1 - ε_low, 1 + ε_high) A)] + λ_KL KL(π_θ ‖ π_ref) - β_ent H(π_θ)

This module only gathers inputs: log-probs of the current policy (with
gradient), of the behaviour policy (recorded at rollout), of the reference
policy (under `no_grad`), and the entropy. The formula, its loss variants,
aggregations and KL estimators live in `grpo.functional.policy_loss`.

Departures from the framework API:
- Token-level: a policy implementing `TokenLevelPolicy` is scored per token
  with its completion mask; any other policy is treated as one "token" per
  action (T = 1, all-True mask).
- Entropy: the bonus uses the exact entropy H(π(· | state, prefix)) that a
  token-level policy reports. A policy that reports none gets no bonus (a
  warning says so): the sample estimate -log π(a) of a sampled a has zero
  expected gradient (E_π[∇ log π(a)] = 0), so it would look like a
  regulariser without acting as one.
- The reference policy is not evaluated at all when `kl_coeff == 0` or it is
  None.
- A batch without recorded old log-probs (`log_prob_old_groups` None, see
  `grpo.step.collect`) is on-policy: π_old is the detached current
  log-probs, so the ratio is exactly 1 and the gradient is that of ratio 1.
- A policy whose actions were sampled by a different engine than the one that
  scores them may offer `rollout_importance_weights(actions, old_logprobs (N, T))
  -> (N, T) | None`: per-token weights on the policy loss (truncated importance
  sampling, `grpo.functional.importance`); None or no such method = all 1.
- Samples drawn with older weights than π_old's (overlapped rollouts) carry the
  sampler's log-probs (`Rollout.sampler_logprobs`): their weights are
  min(π_old / π_sampler, tis_cap) (AReaL's decoupled objective), whatever the
  policy's own weights would be. Only the policy term is weighted (docs/async.md).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from grpo.functional.importance import mismatch_metrics, truncated_importance_weights
from grpo.functional.losses import GlobalCounts, policy_loss
from grpo.protocols import TokenLevelPolicy, TokenLogProbs, hook
from grpo.records import ExperienceBatch, Rollout

__all__ = ["GRPOObjective", "behaviour_metrics", "behaviour_weights", "policy_logprobs"]


class GRPOObjective:
    """Clipped surrogate + KL penalty - entropy bonus, with selectable variants."""

    def __init__(
        self,
        clip_epsilon: float = 0.2,
        kl_coeff: float = 0.04,
        entropy_coeff: float = 0.01,
        loss_type: str = "clipped",
        aggregation: str = "sequence_mean",
        kl_estimator: str = "k3",
        clip_epsilon_high: float | None = None,
        max_completion_length: int | None = None,
        tis_cap: float | None = None,
    ) -> None:
        """`tis_cap`: the cap of the behaviour correction of stale samples (None = none)."""
        self.tis_cap = tis_cap
        self.clip_epsilon = clip_epsilon
        self.kl_coeff = kl_coeff
        self.entropy_coeff = entropy_coeff
        self.loss_type = loss_type
        self.aggregation = aggregation
        self.kl_estimator = kl_estimator
        self.clip_epsilon_high = clip_epsilon_high
        self.max_completion_length = max_completion_length
        self._warned_no_entropy = False

    def compute_loss(
        self,
        current_policy: Any,
        reference_policy: Any,
        experience_batch: ExperienceBatch,
        advantages: Tensor,
        global_counts: GlobalCounts | None = None,
    ) -> dict[str, Tensor | float]:
        """Loss dict: total_loss (with gradient), policy_loss, kl_penalty, entropy_bonus, stats.

        total_loss = policy_loss + kl_penalty - entropy_bonus, where kl_penalty is
        λ_KL·KL and entropy_bonus is β_ent·H; the other entries are the detached
        statistics of `grpo.functional.policy_loss` ("clip/low_frac", "kl/mean", ...).
        `global_counts`: these samples are part of a larger batch of that many sequences
        and tokens (split across micro-batches or processes); the loss terms are then
        this part's share of the larger batch's loss.
        """
        advantages = torch.as_tensor(advantages)
        samples = experience_batch.to_rollout()._replace(advantages=advantages)
        return self.loss(current_policy, reference_policy, samples, global_counts)

    def loss(
        self,
        current_policy: Any,
        reference_policy: Any,
        samples: Rollout,
        global_counts: GlobalCounts | None = None,
    ) -> dict[str, Tensor | float]:
        """`compute_loss` on the trainer's flat record of the samples (advantages included)."""
        states, actions = samples.states, samples.actions  # (N,) each
        N = len(actions)
        advantages = samples.advantages
        if advantages is None or advantages.dim() != 1 or advantages.shape[0] != N:
            got = None if advantages is None else tuple(advantages.shape)
            raise ValueError(
                f"advantages: expected shape ({N},), one per sampled action; got {got}"
            )
        current = policy_logprobs(current_policy, states, actions)
        device = current.logprobs.device
        old_logprobs = _old_logprobs(samples, current)  # (N, T), None = on-policy
        old_logprobs = None if old_logprobs is None else old_logprobs.to(device)
        ref_logprobs = None
        if self.kl_coeff > 0 and reference_policy is not None:
            with torch.no_grad():
                ref_logprobs = policy_logprobs(reference_policy, states, actions).logprobs
            ref_logprobs = ref_logprobs.to(device)  # (N, T)
        entropy = self._entropy(current)
        weights = None  # on-policy: sampled by the scorer itself, nothing to correct
        if samples.sampler_logprobs is not None and old_logprobs is not None:
            # sampled with older weights: decoupled PPO's π_old / π_sampler (N, T), against the
            # sampler's own log-probs, truncated at tis_cap; a policy's own weights assume
            # π_old and the sampler share weights (top-p's p / q = Z <= 1 then), not so here
            weights = behaviour_weights(
                old_logprobs, samples.sampler_logprobs, current.completion_mask, self.tis_cap
            )
        elif old_logprobs is not None:
            weights = _importance_weights(current_policy, actions, old_logprobs)  # (N, T) or None
        elif hook(current_policy, "sampler_is_scorer") is not True:
            # the old pass was skipped (one update per rollout): π_old is this pass, detached
            weights = _detached_old_weights(current_policy, actions, current)  # (N, T) or None
        loss, stats = policy_loss(
            current.logprobs,
            old_logprobs,
            advantages.to(device=device, dtype=torch.float32),
            current.completion_mask.to(device),
            loss_type=self.loss_type,
            aggregation=self.aggregation,
            eps_low=self.clip_epsilon,
            eps_high=self.clip_epsilon_high,
            ref_logprobs=ref_logprobs,
            beta=self.kl_coeff if ref_logprobs is not None else 0.0,
            kl_estimator=self.kl_estimator,
            entropy=entropy,
            entropy_coeff=self.entropy_coeff if entropy is not None else 0.0,
            max_completion_length=self.max_completion_length,
            global_counts=global_counts,
            importance_weights=None if weights is None else weights.to(device),
        )
        return {
            "total_loss": loss,
            "policy_loss": stats["loss/policy"],
            "kl_penalty": stats["loss/kl"],
            "entropy_bonus": -stats["loss/entropy"],  # β_ent·H, subtracted from the loss
            **stats,
        }

    def _entropy(self, current: TokenLogProbs) -> Tensor | None:
        """The policy's entropy (N, T) if reported (logged even at entropy_coeff 0)."""
        if current.entropy is None and self.entropy_coeff > 0:
            if not self._warned_no_entropy:
                warnings.warn(
                    f"entropy_coeff={self.entropy_coeff} but the policy reports no entropy "
                    "(TokenLogProbs.entropy); the entropy bonus is 0. Implement "
                    "get_token_log_probabilities with entropy, or set entropy_coeff=0.",
                    stacklevel=3,
                )
                self._warned_no_entropy = True
            return None
        return current.entropy


def policy_logprobs(policy: Any, states: list[Any], actions: list[Any]) -> TokenLogProbs:
    """Per-token log-probs (N, T) and mask, from either policy contract (T = 1 if per-action)."""
    if isinstance(policy, TokenLevelPolicy):
        out = policy.get_token_log_probabilities(states, actions)
        return TokenLogProbs(out.logprobs, out.completion_mask.bool(), out.entropy)
    logprobs = policy.get_log_probabilities(states, actions)  # (N,)
    if tuple(logprobs.shape) != (len(actions),):
        raise ValueError(
            f"get_log_probabilities must return shape ({len(actions)},); "
            f"got {tuple(logprobs.shape)}"
        )
    logprobs = logprobs[:, None]  # (N, 1): the whole action is one "token"
    return TokenLogProbs(logprobs, torch.ones_like(logprobs, dtype=torch.bool), None)


def _importance_weights(policy: Any, actions: list[Any], old_logprobs: Tensor) -> Tensor | None:
    """The policy's per-token loss weights for these actions (N, T), or None for all 1."""
    weigh = hook(policy, "rollout_importance_weights")
    return None if weigh is None else weigh(actions, old_logprobs)


def _detached_old_weights(policy: Any, actions: list[Any], current: TokenLogProbs) -> Tensor | None:
    """π_old / π_sampler weights (N, T) with π_old the detached current log-probs, and the
    sampler gap recorded as the old pass would have (`note_old_logprobs`)."""
    old = current.logprobs.detach()  # (N, T)
    note = hook(policy, "note_old_logprobs")
    if note is not None:
        note(actions, old, current.completion_mask)
    return _importance_weights(policy, actions, old)


def behaviour_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, cap: float | None
) -> Tensor:
    """min(π_old / π_sampler, cap) per token (N, T) for samples of older weights; cap None =
    untruncated. `sampler_logprobs` (N, T') may be scored at another padding width."""
    sampler, mask = _aligned(old_logprobs, sampler_logprobs, completion_mask)
    return truncated_importance_weights(old_logprobs.float(), sampler, mask, cap)


def behaviour_metrics(
    old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, cap: float | None
) -> dict[str, float]:
    """The gap between π_old (N, T) and the sampler's log-probs (N, T') over counted tokens,
    and the share of `behaviour_weights` capped (`grpo.functional.importance.MISMATCH_KEYS`)."""
    sampler, mask = _aligned(old_logprobs, sampler_logprobs, completion_mask)
    return mismatch_metrics(old_logprobs.float(), sampler, mask, cap)


def _aligned(old: Tensor, sampler: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The sampler's log-probs cut or zero-padded to old's (N, T), and the mask as bool."""
    T = old.shape[1]
    sampler = sampler.float().to(old.device)[:, :T]  # (N, <= T)
    sampler = torch.nn.functional.pad(sampler, (0, T - sampler.shape[1]))  # (N, T)
    return sampler, mask.to(old.device).bool()


def _old_logprobs(samples: Rollout, current: TokenLogProbs) -> Tensor | None:
    """log π_old per token, matching the current log-probs' (N, T); None when not recorded."""
    if samples.old_logprobs is None:
        return None  # on-policy: policy_loss takes the detached current log-probs
    # kept in fp32 even for a bf16 policy: the ratio exp(logprobs - old) is precision-sensitive
    old = samples.old_logprobs.float()  # (N, T_old)
    N, T = current.logprobs.shape
    if old.shape[0] != N:
        raise ValueError(f"old log-probs have {old.shape[0]} rows for {N} actions")
    # A mini-batch may be scored with a shorter padding width than the whole
    # rollout had: columns beyond every counted token are padding on both sides.
    if old.shape[1] > T:
        if samples.completion_mask is not None and bool(samples.completion_mask[:, T:].any()):
            raise ValueError(
                f"the policy returned {T} token positions but the rollout recorded "
                f"counted tokens up to position {old.shape[1]}"
            )
        old = old[:, :T]
    elif old.shape[1] < T:
        if bool(current.completion_mask[:, old.shape[1] :].any()):
            raise ValueError(
                f"the policy counts tokens up to position {T} but the rollout recorded log "
                f"π_old for {old.shape[1]} position(s); collect it with the same policy"
            )
        old = torch.nn.functional.pad(old, (0, T - old.shape[1]))
    return old  # (N, T)
