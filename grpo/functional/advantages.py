"""Group-relative advantages: one scalar per sample from the rewards of its group.

Follows GRPO (DeepSeekMath, Shao et al. 2024): A = (r - mean(group)) / std(group),
in the chess loop's form `(r - mean) / (std + 1e-4)` with the unbiased sample std
(what `torch.std` returns). Variants, each a small function in a table:

- baselines (`BASELINES`): "mean" (GRPO), "leave_one_out" (RLOO, Ahmadian et
  al. 2024: the mean of the other G - 1 rewards), "none" (plain REINFORCE);
- scales (`SCALES`): "group" (per-group sample std + eps, GRPO / the chess loop),
  "batch" (std of all rewards in the batch + eps), "none" (Dr. GRPO, Liu et
  al. 2025, drops the std because it reweights easy and hard prompts);
- `positive_only` clamps negative advantages to 0 (picoRL, Ludic's option).

Departures: a group whose rewards are all equal gets exactly 0 with the
group-relative baselines (the centred value is zero in exact arithmetic; in
floats `r - mean` can be 1e-17, which the std division would blow up), and a
zero spread (possible with eps = 0) leaves values unscaled instead of NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo.functional._checks import check_positive, lookup

__all__ = ["BASELINES", "SCALES", "group_advantages", "informative", "informative_groups"]


def _mean_baseline(grouped: Tensor) -> Tensor:
    return grouped.mean(dim=1, keepdim=True)  # (B, 1)


def _leave_one_out_baseline(grouped: Tensor) -> Tensor:
    # RLOO: each sample is compared with the mean of the other G - 1 samples,
    # so its own reward does not bias its baseline
    group_size = grouped.shape[1]
    return (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (B, G)


def _no_baseline(grouped: Tensor) -> Tensor:
    return torch.zeros_like(grouped[:, :1])  # (B, 1)


BASELINES: dict[str, Callable[[Tensor], Tensor]] = {
    "mean": _mean_baseline,
    "leave_one_out": _leave_one_out_baseline,
    "none": _no_baseline,
}
"""name -> fn(rewards (B, G)) -> baseline broadcastable to (B, G)."""

# the baselines under which an all-equal group is centred to exactly zero
_GROUP_RELATIVE = ("mean", "leave_one_out")


def _group_scale(grouped: Tensor, eps: float) -> Tensor:
    return grouped.std(dim=1, keepdim=True) + eps  # (B, 1) unbiased sample std, the chess loop


def _batch_scale(grouped: Tensor, eps: float) -> Tensor:
    return (grouped.std() + eps).reshape(1, 1)  # (1, 1) one std over all N rewards


def _no_scale(grouped: Tensor, eps: float) -> Tensor:
    return torch.ones_like(grouped[:1, :1])  # (1, 1)


SCALES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "group": _group_scale,
    "batch": _batch_scale,
    "none": _no_scale,
}
"""name -> fn(rewards (B, G), eps) -> divisor broadcastable to (B, G)."""


def _check_rewards(rewards: Tensor, group_size: int) -> None:
    if not isinstance(rewards, Tensor):
        raise TypeError(
            f"rewards: expected a torch.Tensor of shape (N,), got {type(rewards).__name__}"
        )
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError(
            f"rewards: got shape {tuple(rewards.shape)}; allowed: a non-empty flat (N,) tensor "
            "in state-major order (sample n = i * G + j)"
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size: got {group_size!r}; allowed: an int >= 2")
    if rewards.numel() % group_size:
        raise ValueError(
            f"rewards: got {rewards.numel()} rewards, not divisible by group_size={group_size}; "
            "allowed: N = B * group_size"
        )
    finite = torch.isfinite(rewards)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0])
        raise ValueError(
            f"rewards: got {rewards[bad].item()} at sample {bad}; allowed: finite values"
        )


def group_advantages(
    rewards: Tensor,
    group_size: int,
    baseline: str = "mean",
    scale: str = "group",
    eps: float = 1e-4,
    positive_only: bool = False,
) -> Tensor:
    """Advantages (N,) from rewards (N,) in groups of `group_size` consecutive samples.

    A_n = (r_n - baseline_n) / scale_n, then clamped at 0 if `positive_only`.
    With the defaults this is the chess loop's formula exactly:
    (r - mean(group)) / (std(group, unbiased) + 1e-4).
    Example: rewards [0, 1, 2, 3], G = 4: mean 1.5, std sqrt(5/3) = 1.290994...,
    A = [-1.5, -0.5, 0.5, 1.5] / 1.291094... = [-1.161805, -0.387268, 0.387268, 1.161805].
    """
    _check_rewards(rewards, group_size)
    baseline_fn = lookup(BASELINES, baseline, "baseline")
    scale_fn = lookup(SCALES, scale, "scale")
    eps = check_positive(eps, "eps", allow_zero=True)
    if rewards.is_floating_point():
        grouped = rewards.detach().view(-1, group_size)  # (B, G)
    else:  # integer or bool rewards (e.g. 0/1 correctness)
        grouped = rewards.detach().view(-1, group_size).to(torch.float32)

    centred = grouped - baseline_fn(grouped)  # (B, G)
    divisor = scale_fn(grouped, eps)  # (B, 1) or (1, 1)
    # a zero spread (only possible with eps = 0) leaves values unscaled instead of NaN
    divisor = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
    advantages = centred / divisor  # (B, G)
    if baseline in _GROUP_RELATIVE:
        constant = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # (B, 1)
        advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    if positive_only:
        advantages = advantages.clamp(min=0)
    return advantages.reshape(-1)  # (N,)


def informative(advantages: Tensor) -> Tensor:
    """(N,) advantages -> (N,) bool: True where a sample's advantage is not 0.

    The one test of "informative": a sample with advantage exactly 0 has policy loss
    and gradient exactly 0 (with no KL or entropy term), whatever the baseline, scale
    or `positive_only` made it so.
    """
    return advantages != 0  # (N,)


def informative_groups(advantages: Tensor, group_size: int) -> Tensor:
    """(N,) advantages -> (B,) bool: True where some sample of the group is `informative`."""
    return informative(advantages).view(-1, group_size).any(dim=1)  # (B,)
