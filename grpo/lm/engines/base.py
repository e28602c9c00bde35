"""What every rollout engine is: the `RolloutEngine` protocol, its `Samples`, and chunking.

An engine turns prompt rows (token ids, each prompt already repeated G
times) into new token ids, and, when it is not the trainer's own model, the
log-prob it gave each sampled token. `CausalLMPolicy` cuts the ids into
`Completion`s (EOS, stop strings, truncation) the same way whatever the engine,
so completion masks do not depend on it. The engines themselves, by name, are
in `grpo.lm.engines.ROLLOUT_ENGINES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from grpo.lm.sampling import GenerationSettings, left_pad

__all__ = ["RolloutEngine", "Samples", "sample_in_chunks"]

class Samples(NamedTuple):
    """New tokens of n prompt rows."""

    token_ids: list[list[int]]  # (n, <= max_new_tokens) sampled ids, before any EOS/stop cut
    # (n, same lengths) log-probs of the distribution each token was drawn from, when that is
    # not the trainer's (another engine, or a top-k/top-p truncation); None = the trainer's
    logprobs: list[list[float]] | None


class RolloutEngine(Protocol):
    """What `CausalLMPolicy` needs from an engine."""

    tis_cap: float | None
    """Cap of truncated importance sampling on the loss; None = no correction."""
    metrics: dict[str, float]
    """Statistics of the engine's last rollout (e.g. weight-sync time), merged into the
    policy's rollout metrics; empty for engines that keep none."""
    samples_with_scorer: bool
    """True when the engine samples with the very model and numerics that score the loss,
    so the rollout's log-probs are the trainer's (an engine without it counts as False)."""

    def sample(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples: ...


def sample_in_chunks(
    prompt_rows: Sequence[Sequence[int]],
    settings: GenerationSettings,
    seed: int | None,
    pad_id: int,
    device: torch.device,
    decode: Callable[[Tensor, Tensor], Samples],
) -> Samples:
    """Run `decode(ids (n, L), attention_mask (n, L)) -> Samples` on left-padded chunks of at
    most `generation_batch_size` rows, under a forked RNG seeded with `seed`."""
    step = settings.generation_batch_size or len(prompt_rows)
    devices = [device] if device.type == "cuda" else []
    parts: list[Samples] = []
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        for start in range(0, len(prompt_rows), step):
            ids, mask = left_pad(prompt_rows[start : start + step], pad_id)
            parts.append(decode(ids.to(device), mask.to(device)))
    token_ids = [row for part in parts for row in part.token_ids]
    if any(part.logprobs is None for part in parts):
        return Samples(token_ids, None)
    return Samples(token_ids, [row for part in parts for row in part.logprobs])
