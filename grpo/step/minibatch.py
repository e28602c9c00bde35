"""Mini-batches of a rollout: the samples one gradient pass trains on.

`shuffled_mini_batches` shuffles the N samples of a step and cuts them into
mini-batches of `batch_size`. Every rank of a data-parallel run draws the
same permutation of the N global samples and keeps the samples of each
mini-batch it holds (`grpo.distributed`); in one process it holds them all.
Each mini-batch carries the counts of the whole mini-batch (its sequences and
the tokens its loss counts, over every rank), so that its loss is its share
of the whole mini-batch's loss whatever part of it this process holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from grpo.functional.losses import GlobalCounts
from grpo.records import Rollout

__all__ = ["MiniBatch", "shuffled_mini_batches"]


class MiniBatch(NamedTuple):
    """The samples of one mini-batch that this process trains on."""

    samples: Rollout  # this process's samples of it, advantages included
    size: int  # samples in the whole mini-batch (over every rank)
    counts: GlobalCounts  # sequences and counted tokens of the whole mini-batch
    scale: float = 1.0  # 0 for a stand-in sample on a rank that holds none of it


def shuffled_mini_batches(
    rollout: Rollout,
    advantages: Tensor,
    token_counts: Tensor,
    batch_size: int,
    generator: torch.Generator,
    parallel: Any,
) -> Iterator[MiniBatch]:
    """Mini-batches of `batch_size` of the N global samples, in an order drawn from
    `generator`. `rollout` holds this process's samples; `advantages` (N,) and
    `token_counts` (N,) are global; `parallel` (`SingleProcess` or `DataParallel`)
    says which samples this process holds."""
    N = len(advantages)
    order = torch.randperm(N, generator=generator)
    for start in range(0, N, batch_size):
        idx = order[start : start + batch_size]  # (n,) global sample ids
        owned, rows, scale = parallel.own(idx, rollout.num_samples)
        counts = GlobalCounts(len(idx), int(token_counts[idx].sum()))
        samples = rollout.take(rows)._replace(advantages=advantages[owned])
        yield MiniBatch(samples, len(idx), counts, scale)
