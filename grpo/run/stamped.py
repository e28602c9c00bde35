"""Version-stamped batches: what a rollout worker (thread or process) draws for a step.

Both workers of an overlapped run (`grpo.run.overlap`, `grpo.run.overlap_process`) hold
the same things (`Producer`: the run's parts and its schedule) and draw a step's batch
the same way (`sample_stamped`): sample and reward with the weights version the step
samples with, and, for a batch drawn with older weights than it is trained with, hand
the loss the sampler's own log-probs (`Rollout.sampler_logprobs`).

Those log-probs are the ones the sampling engine recorded with the actions where it
recorded any (vLLM's, another precision's, top-k / top-p's truncated q: the distribution
the tokens were drawn from; the policy's `sampler_logprobs`), else the sampler copy's
scores without gradient (`time/sampler/logprobs`). The loss weighs each token by
min(π_old / π_sampler, `rollout.tis_cap`) against them (`grpo.step.objective`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpo.protocols import hook
from grpo.records import Rollout
from grpo.step.collect import sample_rollout, score_old_logprobs
from grpo.step.staleness import sampling_version
from grpo.step.timing import StepTimer

__all__ = [
    "Producer", "StampedBatch", "copy_weights", "drawn_state", "sample_stamped",
    "stale_sampler_logprobs",
]  # fmt: skip


@dataclass
class StampedBatch:
    """The samples of one step, stamped with the weights version that drew them."""

    step: int  # the step that trains on them
    version: int  # the weights version that sampled them
    rollout: Rollout  # N = B * G samples; sampler_logprobs set when version < step
    metrics: dict[str, float]  # the sampler's: rollout and reward metrics, its times


class Producer:
    """What a rollout worker (thread or process) holds: the run's parts and its schedule."""

    def __init__(
        self, policy: Any, reward_model: Any, sampler: Any, group_size: int,
        max_staleness: int, num_steps: int,
    ) -> None:  # fmt: skip
        self.policy = policy
        self.reward_model = reward_model
        self.sampler = sampler  # the loop's StateSampler: only the worker draws while it runs
        self.G = group_size
        self.k = max_staleness
        self.num_steps = num_steps
        self.first = 0  # the version the worker starts from
        self._resume: dict[int, dict[str, Any]] = {}  # step -> state before its batch was drawn

    def close(self) -> None:
        """Stop the worker and drop what it sampled ahead (each worker's own)."""
        raise NotImplementedError

    def forget_drawn(self) -> None:
        """Forget where earlier batches were drawn (a loaded checkpoint says where)."""
        self.close()
        self._resume.clear()

    def needed(self, version: int) -> bool:
        """Whether a later step samples with `version` (else publishing it is skipped)."""
        return version <= sampling_version(self.num_steps - 1, self.k, self.first)


def copy_weights(into: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    """Copy each of `source`'s tensors into the tensor of the same name in `into`."""
    with torch.no_grad():
        for name, tensor in into.items():
            tensor.copy_(source[name])


def drawn_state(policy: Any, sampler: Any) -> dict[str, Any]:
    """Where the prompts and `policy`'s sampling seeds are, before the next draw."""
    sampling = hook(policy, "sampling_state")
    state = sampler.state_dict() if hasattr(sampler, "state_dict") else None
    return {"sampler": state, "policy_sampling": sampling() if callable(sampling) else None}


def sample_stamped(
    policy: Any, reward_model: Any, states: list[Any], G: int, step: int, version: int
) -> StampedBatch:
    """Sample and reward the batch of `step` with `policy` (holding `version`'s weights); a
    stale one (version < step) carries the sampler's log-probs (`stale_sampler_logprobs`).
    `time/wait_weights` is the caller's to add."""
    timer = StepTimer()
    rollout = sample_rollout(policy, reward_model, states, G, timer)
    metrics = {
        **(hook(policy, "rollout_metrics") or {}),
        **(hook(reward_model, "last_metrics") or {}),
    }
    scoring = 0.0
    if version < step:
        begin = time.perf_counter()
        sampler_logprobs, scored = stale_sampler_logprobs(policy, rollout)
        rollout = rollout._replace(sampler_logprobs=sampler_logprobs)
        scoring = time.perf_counter() - begin if scored else 0.0
    metrics.update({
        "time/sampler/sampling": timer.seconds["sampling"],
        "time/sampler/rewards": timer.seconds["rewards"],
        "time/sampler/logprobs": scoring,
    })  # fmt: skip
    return StampedBatch(step, version, rollout, metrics)


def stale_sampler_logprobs(policy: Any, rollout: Rollout) -> tuple[Tensor, bool]:
    """(the log-probs (N, T') the actions were sampled with, whether a scoring pass made them):
    the ones the policy's engine recorded where it did, else `policy` scores them now."""
    recorded = hook(policy, "sampler_logprobs")
    logprobs = recorded(rollout.actions) if recorded is not None else None
    if logprobs is not None:
        return logprobs, False
    return score_old_logprobs(policy, rollout).old_logprobs, True
