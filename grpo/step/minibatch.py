"""Mini-batches of a rollout and the optimizer steps they make up.

`optimizer_windows` shuffles the N samples of a step and cuts them into
windows of `batch_size * gradient_accumulation_steps` samples: one optimizer
step each. A window's samples are put back in sample order before it is cut
into its `gradient_accumulation_steps` mini-batches of `batch_size`: the sum
over a window is the same whichever mini-batch a sample lands in, and in
sample order the G rows of a group stay together and share one prompt forward.
With one window per rollout and `batch_size` = G, every mini-batch is one group,
and only its activations live until its backward pass. Every rank of a
data-parallel run draws the same permutation of the N global samples and keeps
the samples of each mini-batch it holds (`grpo.distributed`); in one process
it holds them all.

Each mini-batch carries the counts of its whole window (sequences and the
tokens its loss counts, over every mini-batch of the window and every rank),
so its loss is its share of the window's loss and the shares add up to the
loss of one concatenated batch: the token-level denominator of DAPO is the
token count of the optimizer step, not of a micro-batch.

`skip_zero` drops samples whose advantage is exactly 0 before they are scored
(their loss and gradient are exactly 0 when no KL or entropy term is added);
they still count in the window's denominators, so the update is the one
without skipping. A mini-batch left empty on every rank is not run at all.
`skips_zero_advantage` says when a step skips them (`GRPOConfig.skip_zero_advantage`):
where skipping is exact, or "always" (their KL and entropy terms then leave the loss).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from grpo.functional.advantages import informative
from grpo.functional.losses import GlobalCounts
from grpo.records import Rollout

__all__ = ["MiniBatch", "optimizer_windows", "skips_zero_advantage"]


class MiniBatch(NamedTuple):
    """The samples of one mini-batch that this process trains on."""

    samples: Rollout  # this process's samples of it, advantages included
    counts: GlobalCounts  # sequences and counted tokens of the whole window (every rank)
    scale: float = 1.0  # 0 for a stand-in sample on a rank that holds none of it


def skips_zero_advantage(config: Any, has_kl_term: bool) -> bool:
    """Whether zero-advantage samples are skipped under `config` (a `GRPOConfig`): where their
    loss and gradient are exactly 0 (no KL term, entropy_coeff 0), or always."""
    exact = not has_kl_term and config.entropy_coeff == 0
    return config.skip_zero_advantage == "always" or (config.skip_zero_advantage is True and exact)


def optimizer_windows(
    rollout: Rollout,
    advantages: Tensor,
    token_counts: Tensor,
    config: Any,
    generator: torch.Generator,
    parallel: Any,
    skip_zero: bool = False,
) -> Iterator[list[MiniBatch]]:
    """The mini-batches of each optimizer step, in an order drawn from `generator`.

    `rollout` holds this process's samples; `advantages` (N,) and `token_counts`
    (N,) are global; `config` is the `GRPOConfig` (batch_size,
    gradient_accumulation_steps); `parallel` (`SingleProcess` or `DataParallel`)
    says which samples this process holds.
    """
    N = len(advantages)
    order = torch.randperm(N, generator=generator)  # (N,) global sample ids
    window = config.batch_size * config.gradient_accumulation_steps
    for start in range(0, N, window):
        # in sample order, so a group's rows share a mini-batch and one prompt forward
        # (grpo.lm.prefix); the window's loss is a sum over its rows, the same in any order
        ids = order[start : start + window].sort().values
        counts = GlobalCounts(len(ids), int(token_counts[ids].sum()))
        batches = []
        for begin in range(0, len(ids), config.batch_size):
            idx = ids[begin : begin + config.batch_size]  # (n,) one mini-batch
            if skip_zero:
                idx = idx[informative(advantages[idx])]
                if len(idx) == 0:
                    continue  # nothing to learn from, on any rank: not run
            owned, rows, scale = parallel.own(idx, rollout.num_samples)
            samples = rollout.take(rows)._replace(advantages=advantages[owned])
            batches.append(MiniBatch(samples, counts, scale))
        yield batches
