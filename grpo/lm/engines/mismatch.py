"""The sampling engine's log-probs beside the trainer's, for a batch of `Completion`s.

A completion sampled by vLLM carries `engine_logprobs`, vLLM's log-prob of
each of its tokens. Next to the trainer's log-probs of the same tokens at
rollout time (`old_logprobs`), they give the gap metrics and the truncated
importance weights of `grpo.functional.importance` (Yao et al. 2025).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from grpo.functional.importance import mismatch_metrics, truncated_importance_weights
from grpo.lm.completion import Completion

__all__ = ["engine_logprobs", "gap_metrics", "importance_weights"]


def engine_logprobs(actions: Sequence[Completion], width: int) -> tuple[Tensor, Tensor] | None:
    """(logprobs (N, width) float32, present (N, width) bool), or None if any action has none.

    Positions past a completion's last token are 0 and not present.
    """
    if not actions or any(a.engine_logprobs is None for a in actions):
        return None
    logprobs = torch.zeros(len(actions), width, dtype=torch.float32)  # (N, width)
    present = torch.zeros(len(actions), width, dtype=torch.bool)  # (N, width)
    for i, action in enumerate(actions):
        values = action.engine_logprobs[:width]
        logprobs[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
        present[i, : len(values)] = True
    return logprobs, present


def gap_metrics(
    actions: Sequence[Completion],
    old_logprobs: Tensor,
    completion_mask: Tensor,
    tis_cap: float | None,
) -> dict[str, float]:
    """ "rollout/logprob_gap_mean|max" over counted tokens (and "rollout/tis_capped_frac").

    old_logprobs, completion_mask (N, T): the trainer's rollout-time scores. Empty
    when the actions carry no engine log-probs.
    """
    engine = engine_logprobs(actions, old_logprobs.shape[1])
    if engine is None:
        return {}
    sampler, present = (t.to(old_logprobs.device) for t in engine)
    mask = completion_mask.bool() & present  # (N, T)
    return mismatch_metrics(old_logprobs.float(), sampler, mask, tis_cap)


def importance_weights(
    actions: Sequence[Completion], old_logprobs: Tensor, tis_cap: float | None
) -> Tensor | None:
    """Truncated importance weights (N, T) for the loss; None without a cap or engine log-probs."""
    if tis_cap is None:
        return None
    engine = engine_logprobs(actions, old_logprobs.shape[1])
    if engine is None:
        return None
    sampler, present = (t.to(old_logprobs.device) for t in engine)
    return truncated_importance_weights(old_logprobs.float(), sampler, present, tis_cap)
