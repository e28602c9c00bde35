"""Part 2: group-relative advantages, one number per sample.

GRPO (DeepSeekMath, Shao et al. 2024) samples G completions per prompt and
compares each one with its own group: A = (r - mean(group)) / (std(group) + eps).
The group mean replaces PPO's value network; the std puts every prompt on the
same scale. The variants below change one of the two pieces:

- baseline "mean" (GRPO), "leave_one_out" (RLOO: the mean of the other G - 1
  rewards), "none" (plain REINFORCE: the reward itself);
- scale "group" (std of the group + eps), "batch" (std of all N rewards + eps),
  "none" (Dr. GRPO, Liu et al. 2025: no division).

Check: python -m workshop.check --part 2
Library version: grpo/functional/advantages.py.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["group_advantages"]


def group_advantages(
    rewards: Tensor,
    group_size: int,
    baseline: str = "mean",
    scale: str = "group",
    eps: float = 1e-4,
    positive_only: bool = False,
) -> Tensor:
    """Advantages (N,) from rewards (N,), in groups of `group_size` consecutive samples.

    rewards     (N,)  N = B * G, state-major: sample n = i * G + j is sample j of prompt i
                      (float, or int/bool such as 0/1 correctness: compute in float)
    group_size  G >= 2
    returns     (N,)  float

    Example: rewards [0, 1, 2, 3], G = 4: mean 1.5, std sqrt(5/3) = 1.29099...,
    A = [-1.5, -0.5, 0.5, 1.5] / 1.29109... = [-1.1618, -0.3873, 0.3873, 1.1618].

    Hints:
    - `rewards.view(-1, group_size)` is (B, G); reduce over dim=1 with keepdim=True.
    - `torch.std` is the unbiased sample std (divides by G - 1): the one GRPO uses.
    - With baseline "mean" or "leave_one_out", a group whose rewards are all equal
      must get exactly 0 (in floats, r - mean can be 1e-17, and dividing by a tiny
      std blows it up): detect it, use torch.where.
    - positive_only: clamp negative advantages to 0.
    - With eps = 0 a zero std would give NaN: leave such values undivided.
    """
    raise NotImplementedError("part 2: write group_advantages")
