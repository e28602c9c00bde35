"""Rollout engines for causal-LM policies: transformers `generate`, or vLLM sharing the weights.

    policy = CausalLMPolicy.from_pretrained(path, rollout=RolloutSettings(engine="vllm"))

`RolloutSettings` / `VLLMSettings` configure them (the `rollout:` section of a
run's YAML); `ROLLOUT_ENGINES` maps each engine name to its constructor. The
vLLM engine imports `vllm` only when it is built, so nothing here needs it.
See docs/vllm.md.
"""

from grpo.lm.engines.base import (
    ROLLOUT_ENGINES,
    RolloutEngine,
    Samples,
    TransformersEngine,
    make_rollout_engine,
)
from grpo.lm.engines.settings import ENGINE_NAMES, RolloutSettings, VLLMSettings

__all__ = [
    "ENGINE_NAMES",
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "RolloutSettings",
    "Samples",
    "TransformersEngine",
    "VLLMSettings",
    "make_rollout_engine",
]
