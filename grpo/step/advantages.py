"""Group-relative advantages for an `ExperienceBatch` (the framework API).

A thin, stateless wrapper: it flattens `reward_groups` into the sample order
(n = i * G + j) and calls `grpo.functional.group_advantages`, which holds the
formula. With the defaults that is the GRPO paper's
A = (r - mean(group)) / (std(group) + eps).

Departures from the framework API's text:
- `normalize_advantages=True` scales by each *group's* standard deviation (the
  GRPO paper and the `"group"` scale), not by the batch's. The seed's "centre
  and scale across the batch" is available as `scale="batch"` (centring across
  the batch is implied: group-centred advantages already have batch mean 0).
  `normalize_advantages=False` gives the plain A = r - mean(group)
  (`scale="none"`, as in Dr. GRPO).
- The baseline ("mean", "leave_one_out", "none") and `positive_only` of the
  maths core are exposed too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.functional.advantages import group_advantages
from grpo.records import ExperienceBatch

__all__ = ["AdvantageEstimator"]


class AdvantageEstimator:
    """Rewards (B, G) -> advantages (N,), one per sample in flattened order."""

    def __init__(
        self,
        normalize_advantages: bool = True,
        advantage_epsilon: float = 1e-4,
        baseline: str = "mean",
        scale: str | None = None,
        positive_only: bool = False,
    ) -> None:
        if scale is None:
            scale = "group" if normalize_advantages else "none"
        elif not normalize_advantages and scale != "none":
            raise ValueError(
                f"scale={scale!r} contradicts normalize_advantages=False; "
                "leave scale unset or pass scale='none'"
            )
        self.normalize_advantages = normalize_advantages
        self.advantage_epsilon = advantage_epsilon
        self.baseline = baseline
        self.scale = scale
        self.positive_only = positive_only

    def compute_advantages(self, batch: ExperienceBatch) -> Tensor:
        """A 1-D float tensor of length N = B * G in sample order n = i * G + j."""
        if not batch.reward_groups:  # pragma: no cover - collectors reject empty batches
            return torch.zeros(0)
        sizes = {len(group) for group in batch.reward_groups}
        if len(sizes) != 1:
            raise ValueError(
                f"reward_groups: every group must have the same size; got sizes {sorted(sizes)}"
            )
        rewards = torch.tensor(batch.flat_rewards(), dtype=torch.float32)  # (N,)
        return self.from_rewards(rewards, sizes.pop())

    def from_rewards(self, rewards: Tensor, group_size: int) -> Tensor:
        """Flat rewards (N,) in sample order -> advantages (N,)."""
        return group_advantages(
            rewards,
            group_size=group_size,
            baseline=self.baseline,
            scale=self.scale,
            eps=self.advantage_epsilon,
            positive_only=self.positive_only,
        )  # (N,)
