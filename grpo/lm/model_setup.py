"""What a causal-LM policy sets on a transformers model before training with it: dropout
off, activation checkpointing, and the facts it reads (EOS ids, context length)."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["context_length", "disable_dropout", "enable_checkpointing", "eos_ids"]


def disable_dropout(model: nn.Module) -> None:
    """Every dropout probability of the model set to 0, by rule rather than by list: each
    dropout module's `p`, and every number attribute named like a dropout ("dropout" in the
    name, or ending in "_pdrop") of each module and of each module's config (sub-configs
    included). Attention dropout is such a number, read by the attention at forward time."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        _zero_dropout_fields(module)
        config = getattr(module, "config", None)
        if config is not None and not isinstance(config, nn.Module):
            _zero_dropout_fields(config)


def _zero_dropout_fields(owner: Any, seen: set[int] | None = None) -> None:
    """Set owner's dropout-named numbers to 0.0, recursing into configs it holds."""
    seen = set() if seen is None else seen
    if id(owner) in seen:
        return
    seen.add(id(owner))
    for name, value in list(vars(owner).items()):
        if (
            _is_dropout_name(name)
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ):
            setattr(owner, name, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config
            _zero_dropout_fields(value, seen)


def _is_dropout_name(name: str) -> bool:
    return "dropout" in name or name.endswith("_pdrop")


def enable_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing, non-reentrant (works with frozen inputs and LoRA)."""
    kwargs = {"use_reentrant": False}
    if callable(getattr(model, "activation_checkpointing_enable", None)):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def eos_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    """The tokenizer's EOS and every EOS the model's generation config lists."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += [extra] if isinstance(extra, int) else list(extra or [])
    if not ids:
        raise ValueError(
            "neither the tokenizer nor the model's generation_config names an EOS token"
        )
    return sorted(set(ids))


def context_length(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None
