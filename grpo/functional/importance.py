"""Sampler/trainer mismatch: the log-prob gap and truncated importance weights.

When one engine samples (e.g. vLLM) and another scores (the trainer's
model), the two assign slightly different probabilities to the same tokens:
different kernels, fused layers, precision. The samples then come from
π_sampler, not from the π_old the loss treats as the behaviour policy.

Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training") corrects the policy
gradient with a per-token weight, capped at C to bound its variance:

    w_t = min(π_old(o_t) / π_sampler(o_t), C) = min(exp(old_logprobs - sampler_logprobs), C)

w is a constant (no gradient flows through it) that multiplies the per-token
policy-gradient loss. Departures: the weight of a padded position is 1 (it is
masked out of every loss anyway), so padding never produces inf or NaN; and an
untruncated weight (C None) is bounded by the largest finite number of the
log-probs' dtype, so a token the sampler found nearly impossible gives a huge
weight, never inf (exp(89) already overflows float32).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.functional._checks import check_positive, check_shape, check_tensor

__all__ = ["MISMATCH_KEYS", "logprob_gap", "mismatch_metrics", "truncated_importance_weights"]

MISMATCH_KEYS = ("rollout/logprob_gap_mean", "rollout/logprob_gap_max", "rollout/tis_capped_frac")
"""The metrics of `mismatch_metrics`: the sampler-trainer gap and the share of capped weights."""


def _check(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor) -> None:
    check_tensor(old_logprobs, "old_logprobs")
    if old_logprobs.dim() != 2:
        raise ValueError(f"old_logprobs: got shape {tuple(old_logprobs.shape)}; allowed: (N, T)")
    shape = tuple(old_logprobs.shape)
    check_shape(sampler_logprobs, "sampler_logprobs", shape, "old_logprobs")
    check_shape(completion_mask, "completion_mask", shape, "old_logprobs")
    if completion_mask.dtype != torch.bool:
        raise TypeError(f"completion_mask: got dtype {completion_mask.dtype}; allowed: torch.bool")


def truncated_importance_weights(
    old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, cap: float | None
) -> Tensor:
    """w = min(exp(old_logprobs - sampler_logprobs), cap), detached; 1 at padding -> (N, T).

    old_logprobs: the trainer's log-probs at rollout time (N, T); sampler_logprobs:
    the sampling engine's log-probs of the same tokens (N, T); completion_mask (N, T) bool.
    cap None: untruncated, up to the largest finite number of old_logprobs' dtype.
    """
    _check(old_logprobs, sampler_logprobs, completion_mask)
    largest = torch.finfo(old_logprobs.dtype).max
    cap = largest if cap is None else min(check_positive(cap, "cap"), largest)
    log_ratio = (old_logprobs.detach() - sampler_logprobs.detach()).double()  # (N, T)
    # where, not multiplication: padding may hold anything, and exp of it must not leak
    log_ratio = torch.where(completion_mask, log_ratio, torch.zeros_like(log_ratio))
    # in float64 and clamped before the cast: exp(89) is inf in float32, not in float64
    weights = torch.exp(log_ratio).clamp(max=cap)  # (N, T)
    return weights.to(old_logprobs.dtype)


def logprob_gap(
    old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor
) -> dict[str, float]:
    """Mean and max of |old_logprobs - sampler_logprobs| over counted tokens (0 if none).

    Returns {"mean": ..., "max": ...} as Python floats.
    """
    _check(old_logprobs, sampler_logprobs, completion_mask)
    gap = (old_logprobs.detach().double() - sampler_logprobs.detach().double()).abs()  # (N, T)
    counted = gap[completion_mask]  # (number of counted tokens,)
    if counted.numel() == 0:
        return {"mean": 0.0, "max": 0.0}
    return {"mean": counted.mean().item(), "max": counted.max().item()}


def mismatch_metrics(
    old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, cap: float | None
) -> dict[str, float]:
    """`MISMATCH_KEYS`: `logprob_gap`'s mean and max, and with a cap the share of counted
    tokens whose weight exp(old_logprobs - sampler_logprobs) exceeds it (N, T inputs)."""
    gap = logprob_gap(old_logprobs, sampler_logprobs, completion_mask)
    metrics = {MISMATCH_KEYS[0]: gap["mean"], MISMATCH_KEYS[1]: gap["max"]}
    if cap is not None:
        ratio = torch.exp(old_logprobs.detach().double() - sampler_logprobs.detach().double())
        capped = (ratio > cap) & completion_mask  # (N, T)
        metrics[MISMATCH_KEYS[2]] = capped.sum().item() / max(int(completion_mask.sum()), 1)
    return metrics
