"""Part 3: the GRPO loss, a per-token term and the denominator that sums it up.

On-policy GRPO as picoRL teaches it: no ratio, no clip, no KL. Each token of
a completion gets the loss -A * log pi(token), with A its completion's
advantage. The (N, T) token losses then become one number, and the choice of
denominator is the whole difference between the published variants:

    sequence_mean    mean_i [ sum_t l_it / |o_i| ]   GRPO (Shao et al. 2024)
    token_mean       sum_it l_it / sum_i |o_i|        BNPO, DAPO (Yu et al. 2025)
    constant_length  sum_it l_it / (N * L_max)        Dr. GRPO (Liu et al. 2025)
    sequence_sum     mean_i [ sum_t l_it ]            picoRL: -(A * sum logprobs).mean()

|o_i| is the number of counted tokens of completion i (completion_mask.sum(1)).

The library calls these through its tables POLICY_LOSSES["reinforce"] and
AGGREGATIONS[...]; before calling them it has already replaced the padded
positions (completion_mask False) of `logprobs` and `values` with 0.

Check: python -m workshop.check --part 3
Library version: grpo/functional/losses.py.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["constant_length", "reinforce", "sequence_mean", "sequence_sum", "token_mean"]


def reinforce(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, completion_mask: Tensor, clip
) -> Tensor:
    """Per-token REINFORCE loss -A * log pi: (N, T) -> (N, T).

    logprobs         (N, T)  log pi of each completion token, with gradient
    old_logprobs     (N, T)  log-probs at sampling time (unused by REINFORCE)
    advantages       (N, 1)  one advantage per completion, already a column
    completion_mask  (N, T)  bool, True = a token the loss counts (unused here)
    clip                     ratio bounds (unused by REINFORCE)
    returns          (N, T)  the loss of each token; minimising it raises log pi where A > 0

    Hint: one line. Why is there a minus sign?
    """
    raise NotImplementedError("part 3: write reinforce")


def sequence_mean(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    """GRPO: average each completion over its own tokens, then over completions: (N, T) -> ().

    Hint: a completion with no counted tokens has |o_i| = 0; clamp the count to >= 1.
    """
    raise NotImplementedError("part 3: write sequence_mean")


def token_mean(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    """BNPO/DAPO: one average over every counted token of the batch: (N, T) -> ().

    Hint: a batch with no counted token at all must give 0, not NaN.
    """
    raise NotImplementedError("part 3: write token_mean")


def constant_length(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    """Dr. GRPO: the token sum over N * max_length, whatever the lengths: (N, T) -> ()."""
    raise NotImplementedError("part 3: write constant_length")


def sequence_sum(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    """picoRL: sum over each completion's tokens, mean over completions: (N, T) -> ()."""
    raise NotImplementedError("part 3: write sequence_sum")
