"""Staleness bookkeeping of overlapped rollouts: plain numbers and pure functions.

A *version* is one optimizer update of the policy as the run loop counts them: the
weights before step s's update are version s (version 0: the initial weights), so
the trainer trains the batch of step s at version s. The batch of step s is sampled
with the weights of `sampling_version(s, max_staleness, first_version)`, at most
`max_staleness` versions older; its staleness is the trainer's version minus the
sampler's.

The bound is kept by admission, not by dropping: the sampler waits for the version a
step needs before it samples that step's batch, so no group more than
`max_staleness` versions old is ever sampled for training. `admitted` checks it once
more where a batch is trained on; a group it refused would be a fault of the
schedule, so the run stops there with an error naming the step (`grpo.run.overlap`)
rather than train on fewer groups than the step's B.

Follows the staleness-bounded rollouts of AReaL (Fu et al. 2025, "AReaL: A
Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning").
Departure: the version a step samples with is fixed (the oldest allowed, never a
newer one that happens to be ready), so an overlapped run does not depend on
thread timing and is reproducible from its seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "StalenessLog",
    "admitted",
    "sampling_version",
    "staleness",
    "staleness_metrics",
    "steps_ahead",
]


def sampling_version(step: int, max_staleness: int, first_version: int = 0) -> int:
    """The weights version the batch of `step` is sampled with: `step - max_staleness`, never
    before `first_version` (the weights a run starts or resumes with)."""
    return max(step - max_staleness, first_version)


def staleness(trainer_version: int, sampler_version: int) -> int:
    """Versions between the weights that sampled a group and the weights that train on it."""
    if sampler_version > trainer_version:
        raise ValueError(
            f"sampler_version {sampler_version} is newer than trainer_version {trainer_version}"
        )
    return trainer_version - sampler_version


def admitted(
    trainer_version: int, sampler_versions: Sequence[int], max_staleness: int
) -> list[bool]:
    """Per group: may the trainer at `trainer_version` train on it (staleness <= bound)?"""
    return [staleness(trainer_version, v) <= max_staleness for v in sampler_versions]


def steps_ahead(next_step: int, trainer_version: int) -> int:
    """Batches sampled ahead of the trainer: those of steps trainer_version .. next_step - 1
    (sampled, or being sampled, and not yet trained on)."""
    return next_step - trainer_version


@dataclass
class StalenessLog:
    """What one trained step saw: the staleness of each group trained on, and the seconds
    each side waited for the other."""

    trained: list[int] = field(default_factory=list)  # (groups trained,) staleness of each
    wait_samples: float = 0.0  # the trainer waiting for the sampler's batch
    wait_weights: float = 0.0  # the sampler waiting for the weights version it needs


def staleness_metrics(log: StalenessLog) -> dict[str, float]:
    """`staleness/mean|max` and `time/wait_samples|wait_weights` of a step."""
    trained = log.trained
    return {
        "staleness/mean": sum(trained) / len(trained) if trained else 0.0,
        "staleness/max": float(max(trained, default=0)),
        "time/wait_samples": log.wait_samples,
        "time/wait_weights": log.wait_weights,
    }
