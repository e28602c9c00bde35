"""The metrics of one GRPO step: reward statistics of the rollout, and the step's summary.

Both are pure functions of what `GRPOTrainer.train_step` accumulated; docs/metrics.md
explains every key.
"""

from __future__ import annotations

import math

from torch import Tensor

from grpo import distributed
from grpo.functional.advantages import informative

__all__ = ["loss_token_frac", "rollout_metrics", "step_summary"]


def rollout_metrics(rewards: Tensor, advantages: Tensor) -> dict[str, float]:
    """Statistics of the global rewards (B, G) and advantages (N,)."""
    rewards = rewards.double()  # (B, G)
    all_equal = (rewards == rewards[:, :1]).all(dim=1)  # (B,)
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "reward/zero_std_frac": all_equal.double().mean().item(),
        "advantage_mean": advantages.mean().item(),
        "advantage_std": advantages.std().item() if advantages.numel() > 1 else 0.0,
        "total_samples": float(len(advantages)),
    }


def loss_token_frac(advantages: Tensor, tokens: Tensor) -> dict[str, float]:
    """Share of the counted tokens (N,) that belong to informative samples (advantages (N,)):
    the tokens that carry gradient, over which ratio/*, clip/* and entropy/* average when
    zero-advantage samples are skipped."""
    total = int(tokens.sum())
    kept = int(tokens[informative(advantages)].sum())
    return {"loss/token_frac": kept / total if total else 0.0}


def step_summary(totals: dict[str, float]) -> dict[str, float]:
    """Means over every mini-batch of the step (sample-weighted) and step counters."""
    samples, scored = totals.pop("samples"), totals.pop("scored")
    steps = totals.pop("optimizer_steps", 0.0)
    grad_norm_sum = totals.pop("grad_norm_sum", 0.0)
    summary = {
        "step_loss": totals.pop("total_loss", 0.0) / samples,
        "grad_norm": grad_norm_sum / steps if steps else math.nan,
        "optimizer_steps": steps,
        "skipped_steps": totals.pop("skipped_steps", 0.0),
    }
    for key in ("policy_loss", "kl_penalty", "entropy_bonus"):
        totals.pop(key, None)
    shares = {k: v / samples for k, v in totals.items() if k in distributed.SHARE_KEYS}
    means = {k: v / max(scored, 1) for k, v in totals.items() if k not in shares}
    # the share of samples never scored (zero advantage), over the step's epochs
    return {**summary, **shares, **means, "skip/zero_advantage_frac": 1 - scored / samples}
