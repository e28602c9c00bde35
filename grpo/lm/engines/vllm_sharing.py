"""Whether an in-process vLLM engine shares the trainer's weight tensors or copies them.

`expects_sharing` decides before the engine is built (it decides sleep mode),
`match_names` pairs vLLM's parameter names with the trainer's, and
`choose_sharing` makes the final choice once their shapes and storage are compared
(`grpo.lm.engines.weights`). The engine: `grpo.lm.engines.vllm`.
"""

from __future__ import annotations

import torch
from torch import nn

from grpo.lm.engines.settings import VLLMSettings
from grpo.lm.engines.weights import map_parameters
from grpo.lm.loading import is_peft_model

__all__ = ["choose_sharing", "expects_sharing", "match_names"]


def choose_sharing(weight_sync: str, lora: bool, problems: list[str]) -> bool:
    """True = share storage, False = copy; raises when "shared" was asked and cannot be."""
    if weight_sync == "shared" and lora:
        raise ValueError(
            "vllm.weight_sync: got 'shared' with a LoRA model, whose vLLM weights must be "
            "W + BA (a copy); allowed here: 'auto' or 'load_weights'"
        )
    if weight_sync == "shared" and problems:
        raise ValueError(
            "vllm.weight_sync: got 'shared' but vLLM cannot compute with the trainer's "
            f"tensors ({'; '.join(problems[:3])}); allowed here: 'auto' or 'load_weights'"
        )
    return weight_sync != "load_weights" and not lora and not problems


def expects_sharing(settings: VLLMSettings, model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether the engine will share the trainer's tensors, as far as is known before building
    it (names and shapes are compared after): decides whether vLLM gets sleep mode."""
    first = next(model.parameters())
    return (
        settings.weight_sync != "load_weights"
        and not is_peft_model(model)
        and first.dtype == dtype
        and first.device.type == "cuda"
    )


def match_names(
    engine_params: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], settings: VLLMSettings
) -> dict[str, tuple[str, ...]]:
    """vLLM name -> trainer names; {} when nothing needs them (unchecked copies)."""
    if settings.weight_sync == "load_weights" and not settings.check_weights:
        return {}  # vLLM's load_weights maps checkpoint names itself
    try:
        return map_parameters(engine_params, weights)
    except ValueError as error:
        raise ValueError(
            f"{error}. To copy weights without matching names (and without checks), set "
            "vllm.weight_sync: load_weights and vllm.check_weights: false"
        ) from error
