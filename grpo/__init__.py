"""grpo: Group-Relative Policy Optimisation for any policy you can sample and score.

Two ways in:
- text models: `TextTrainer(model, rewards, train_dataset, ...).train()` runs what
  `grpo train CONFIG.yaml` runs, on your own prompts and reward functions;
- any model (the framework API): bring a `PolicyModel` and a `RewardModel`
  (duck-typed, see `grpo.protocols`), build a `GRPOTrainer`, call `train_step`.

Names are resolved lazily so that `import grpo` stays cheap: torch and
transformers are imported only when a name that needs them is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "TextTrainer": "grpo.run.text",
    "RunConfig": "grpo.run.config",
    "TextReward": "grpo.rewards.combine",
    "CausalLMPolicy": "grpo.lm.policy",
    "CausalLMSettings": "grpo.lm.policy",
    "GenerationSettings": "grpo.lm.sampling",
    "MaskedFillPolicy": "grpo.masked_fill.policy",
    "MaskedFillConfig": "grpo.masked_fill.policy",
    "GRPOTrainer": "grpo.step.trainer",
    "GRPOConfig": "grpo.config",
    "PolicyModel": "grpo.protocols",
    "RewardModel": "grpo.protocols",
    "TokenLevelPolicy": "grpo.protocols",
    "TokenLogProbs": "grpo.protocols",
    "validate_policy_model": "grpo.protocols",
    "validate_reward_model": "grpo.protocols",
    "ExperienceBatch": "grpo.records",
}

__all__ = [
    "CausalLMPolicy",
    "CausalLMSettings",
    "ExperienceBatch",
    "GenerationSettings",
    "GRPOConfig",
    "GRPOTrainer",
    "MaskedFillConfig",
    "MaskedFillPolicy",
    "PolicyModel",
    "RewardModel",
    "RunConfig",
    "TextReward",
    "TextTrainer",
    "TokenLevelPolicy",
    "TokenLogProbs",
    "validate_policy_model",
    "validate_reward_model",
]

if TYPE_CHECKING:  # pragma: no cover - for static type checkers only
    from grpo.config import GRPOConfig
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings
    from grpo.masked_fill.policy import MaskedFillConfig, MaskedFillPolicy
    from grpo.protocols import (
        PolicyModel,
        RewardModel,
        TokenLevelPolicy,
        TokenLogProbs,
        validate_policy_model,
        validate_reward_model,
    )
    from grpo.records import ExperienceBatch
    from grpo.step.trainer import GRPOTrainer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
