"""Mini-batches of an experience batch: the samples one gradient step trains on.

`shuffled_mini_batches` shuffles the N samples of a step and cuts them into
mini-batches of `batch_size`; each is an `ExperienceBatch` of singleton groups
(one sample per "group"), because the advantages are already computed over
whole groups. With data parallelism every rank draws the same permutation and
keeps the samples of each mini-batch that it holds (see `grpo.distributed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from grpo.functional.losses import GlobalCounts
from grpo.records import ExperienceBatch

__all__ = ["MiniBatch", "accumulate", "select_samples", "shuffled_mini_batches"]


class MiniBatch(NamedTuple):
    """The samples of one mini-batch that this process trains on."""

    batch: ExperienceBatch  # singleton groups, one per sample
    advantages: Tensor  # (n,)
    num_samples: int  # size of the whole mini-batch (over every rank)
    global_counts: GlobalCounts | None  # its sequences and tokens; None in one process
    scale: float = 1.0  # 0 for a stand-in sample on a rank that holds none (distributed)


def shuffled_mini_batches(
    batch: ExperienceBatch,
    advantages: Tensor,
    batch_size: int,
    generator: torch.Generator,
    data_parallel: Any = None,
) -> Iterator[MiniBatch]:
    """Mini-batches of `batch_size` samples of the global batch (N = len(advantages)) in an
    order drawn from `generator`; `data_parallel` (a `DataParallel` or None) picks this rank's."""
    dp = data_parallel
    N = len(advantages)
    order = torch.randperm(N, generator=generator)
    tokens = None if dp is None else dp.global_token_counts(batch)  # (N,)
    for start in range(0, N, batch_size):
        idx = order[start : start + batch_size]  # (n,) global sample ids
        if dp is None:
            yield MiniBatch(select_samples(batch, idx), advantages[idx], len(idx), None)
            continue
        owned, rows, scale = dp.own(idx)
        counts = GlobalCounts(len(idx), int(tokens[idx].sum()))
        yield MiniBatch(select_samples(batch, rows), advantages[owned], len(idx), counts, scale)


def select_samples(batch: ExperienceBatch, idx: Tensor) -> ExperienceBatch:
    """Samples idx (n,) of `batch` as a batch of n singleton groups."""
    G = batch.group_size
    rows = idx.tolist()
    flat_actions = batch.flat_actions()
    old_groups = batch.log_prob_old_groups
    flat_old = None if old_groups is None else [lp for group in old_groups for lp in group]
    return ExperienceBatch(
        states=[batch.states[n // G] for n in rows],
        action_groups=[[flat_actions[n]] for n in rows],
        reward_groups=[[batch.reward_groups[n // G][n % G]] for n in rows],
        log_prob_old_groups=None if flat_old is None else [[flat_old[n]] for n in rows],
        old_token_logprobs=_rows(batch.old_token_logprobs, idx),
        completion_mask=_rows(batch.completion_mask, idx),
    )


def _rows(tensor: Tensor | None, idx: Tensor) -> Tensor | None:
    return None if tensor is None else tensor[idx.to(tensor.device)]


def accumulate(sums: dict[str, float], loss_dict: dict[str, Any], weight: int) -> None:
    """Add weight * value for every scalar entry of a loss dict."""
    for key, value in loss_dict.items():
        if isinstance(value, Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        if isinstance(value, (int, float)):
            sums[key] += weight * float(value)
