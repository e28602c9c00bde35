"""Rollout engines: what samples a causal-LM policy's completions.

An engine turns prompt rows (token ids, each prompt already repeated G
times) into new token ids, and, when it is not the trainer's own model, the
log-prob it gave each sampled token. `CausalLMPolicy` cuts the ids into
`Completion`s (EOS, stop strings, truncation) the same way whatever the engine,
so completion masks do not depend on it.

Engines, by name (`ROLLOUT_ENGINES`):
- "transformers": the trainer's model samples with `generate` (seed 001: eval
  mode, no_grad, the previous mode restored); see `grpo.lm.sampling`.
- "lean": the trainer's model samples through a decoding loop over its own
  layers (Llama-family models); see `grpo.lm.engines.lean`.
- "vllm": an in-process vLLM engine computing with the trainer's weights
  (seed 003); see `grpo.lm.engines.vllm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from grpo.lm.engines.settings import RolloutSettings
from grpo.lm.sampling import GenerationSettings, sample_token_ids

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "Samples",
    "TransformersEngine",
    "make_rollout_engine",
]


class Samples(NamedTuple):
    """New tokens of n prompt rows."""

    token_ids: list[list[int]]  # (n, <= max_new_tokens) sampled ids, before any EOS/stop cut
    logprobs: list[list[float]] | None  # (n, same lengths) the engine's log-probs; None = trainer's


class RolloutEngine(Protocol):
    """What `CausalLMPolicy` needs from an engine (which may also expose a `metrics` dict,
    merged into the policy's rollout metrics after each rollout)."""

    tis_cap: float | None
    """Cap of truncated importance sampling on the loss; None = no correction."""
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


class TransformersEngine:
    """Samples with the trainer's model itself (`transformers` `generate`).

    Subclasses that also sample with the trainer's model change `_token_ids` only.
    """

    tis_cap = None  # the sampler is the scorer: nothing to correct
    samples_with_scorer = True

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    def sample(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        was_training = self.model.training
        self.model.eval()  # seed 001: no dropout noise in the behaviour policy
        try:
            with torch.no_grad():
                ids = self._token_ids(prompt_rows, settings, eos_ids, seed)
        finally:
            self.model.train(was_training)
        return Samples(ids, None)

    def _token_ids(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> list[list[int]]:
        """New ids per row (eval mode, no_grad) -> (n, <= max_new_tokens)."""
        return sample_token_ids(self.model, self.tokenizer, prompt_rows, settings, eos_ids, seed)


def _lean_engine(model: nn.Module, tokenizer: Any, rollout: RolloutSettings) -> RolloutEngine:
    from grpo.lm.engines.lean import LeanEngine  # imported here: it subclasses TransformersEngine

    return LeanEngine(model, tokenizer)


def _vllm_engine(model: nn.Module, tokenizer: Any, rollout: RolloutSettings) -> RolloutEngine:
    from grpo.lm.engines.vllm import VLLMEngine  # vllm itself is imported only when building one

    return VLLMEngine(model, tokenizer, rollout.vllm)


ROLLOUT_ENGINES: dict[str, Callable[[nn.Module, Any, RolloutSettings], RolloutEngine]] = {
    "transformers": lambda model, tokenizer, rollout: TransformersEngine(model, tokenizer),
    "lean": _lean_engine,
    "vllm": _vllm_engine,
}
"""engine name -> constructor(model, tokenizer, rollout settings)."""


def make_rollout_engine(
    rollout: RolloutSettings, model: nn.Module, tokenizer: Any
) -> RolloutEngine:
    """The engine `rollout.engine` names, built for this model and tokenizer."""
    return ROLLOUT_ENGINES[rollout.engine](model, tokenizer, rollout)
