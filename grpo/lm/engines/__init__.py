"""Rollout engines for causal-LM policies, by name.

    policy = CausalLMPolicy.from_pretrained(path, rollout=RolloutSettings(engine="lean"))

- "transformers" (`transformers.py`, the default): the trainer's model samples with
  `generate` (the chess loop: eval mode, no_grad, the previous mode restored).
- "lean" (`lean.py`): the trainer's model samples through a decoding loop over
  its own layers (Llama-family models), with nothing else per token.
- "vllm" (`vllm.py`, `weights.py`): an in-process vLLM engine computing with the
  trainer's weights (picoRL); `vllm` itself is imported only when one is built.
- "vllm_server" (`vllm_server.py`): running `vllm serve` processes over HTTP, the
  trainer's weights published to a folder they reload from (`vllm_publish.py`,
  `vllm_worker.py`); needs no vLLM in the trainer's environment.

`base.py` holds the engine protocol and its records, `settings.py` the
`rollout:` section of a run's YAML, `mismatch.py` the sampler-scorer gap and
truncated importance weights for engines that are not the trainer. See docs/vllm.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from grpo.lm.engines.base import RolloutEngine, Samples
from grpo.lm.engines.lean import LeanEngine
from grpo.lm.engines.settings import ENGINE_NAMES, RolloutSettings, ServerSettings, VLLMSettings
from grpo.lm.engines.transformers import TransformersEngine
from grpo.lm.engines.vllm import VLLMEngine
from grpo.lm.engines.vllm_server import VLLMServerEngine

__all__ = [
    "ENGINE_NAMES",
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "RolloutSettings",
    "Samples",
    "ServerSettings",
    "TransformersEngine",
    "VLLMSettings",
    "make_rollout_engine",
]


def _own_model(kind: type) -> Callable[[nn.Module, Any, RolloutSettings, str], RolloutEngine]:
    """Constructor of an engine sampling with the trainer's model, in `rollout.precision`
    (None: the scorer's)."""

    def build(model: nn.Module, tokenizer: Any, rollout: RolloutSettings, scorer: str):
        precision = rollout.precision or scorer
        return kind(model, tokenizer, precision, scorer, rollout.tis_cap)

    return build


ROLLOUT_ENGINES: dict[str, Callable[[nn.Module, Any, RolloutSettings, str], RolloutEngine]] = {
    "transformers": _own_model(TransformersEngine),
    "lean": _own_model(LeanEngine),
    "vllm": lambda model, tokenizer, rollout, scorer: VLLMEngine(model, tokenizer, rollout.vllm),
    "vllm_server": lambda model, tokenizer, rollout, scorer: VLLMServerEngine(
        model, tokenizer, rollout.server, rollout.tis_cap
    ),
}
"""engine name -> constructor(model, tokenizer, rollout settings, scorer precision)."""


def make_rollout_engine(
    rollout: RolloutSettings, model: nn.Module, tokenizer: Any, scorer_precision: str = "fp32"
) -> RolloutEngine:
    """The engine `rollout.engine` names, built for this model and tokenizer; the loss scores
    in `scorer_precision` (`grpo.precision.PRECISIONS`)."""
    return ROLLOUT_ENGINES[rollout.engine](model, tokenizer, rollout, scorer_precision)
