"""What differs between the model families the lean engine runs: one `Family` per model type.

The lean loop (`grpo.lm.engines.lean`) runs every family's own modules (embedding,
norms, projections, q/k norms, MLP, output layer, rotary module and rotary helper)
and attends over its cache the same way; a family only says how they are wired:

| family | model types | a layer | rotary angles | logits |
|---|---|---|---|---|
| Llama | llama, mistral, qwen2, qwen3 | x + attn(norm(x)), then x + mlp(norm(x)) | one set | as the output layer gives them |
| Gemma 3 | gemma3_text | x + norm(attn(norm(x))), then x + norm(mlp(norm(x))) | one set per layer type: sliding (local base) and full (global base) | tanh soft-capped when `final_logit_softcapping` is set |

Gemma 3's embedding module multiplies by sqrt(hidden) itself, its norms are its own
(1 + weight) RMSNorms and its attention module's `scaling` comes from
`query_pre_attn_scalar`, so none of them needs a line here. What a family cannot
run exactly is refused by name (`unsupported`): soft-capped attention scores (scaled
dot-product attention has no cap) and bidirectional attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["FAMILIES", "Family"]

Attention = Callable[[Tensor], Tensor]
"""A layer's attention over the cache: normed hidden states (n, S, H) -> o_proj's output (n, S, H)."""


@dataclass(frozen=True)
class Family:
    """How one family's decoding step is wired from the model's own modules."""

    layer_kinds: Callable[[Any], list[str]]
    """config -> each layer's rotary kind, the name its rotary module is asked for."""
    angles: Callable[[nn.Module, Tensor, Tensor, str], tuple[Tensor, Tensor]]
    """(rotary module, dtype probe, positions (n, L), kind) -> cos, sin (n, L, D) each."""
    block: Callable[[nn.Module, Tensor, Attention], Tensor]
    """(decoder layer, residual stream x (n, S, H), its attention) -> x after the layer."""
    cap_logits: Callable[[Tensor, Any], Tensor]
    """(logits (n, V), config) -> the logits the model's forward returns."""
    unsupported: Callable[[Any], str | None]
    """config -> why this model cannot run exactly in the loop, or None."""


def _one_kind(config: Any) -> list[str]:
    return ["all"] * config.num_hidden_layers


def _one_set(
    rotary: nn.Module, probe: Tensor, positions: Tensor, kind: str
) -> tuple[Tensor, Tensor]:
    return rotary(probe, positions)


def _pre_norm_block(layer: nn.Module, x: Tensor, attention: Attention) -> Tensor:
    x = x + attention(layer.input_layernorm(x))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _uncapped(logits: Tensor, config: Any) -> Tensor:
    return logits


def _nothing_unsupported(config: Any) -> str | None:
    return None


def _layer_types(config: Any) -> list[str]:
    return list(config.layer_types)


def _set_per_kind(
    rotary: nn.Module, probe: Tensor, positions: Tensor, kind: str
) -> tuple[Tensor, Tensor]:
    return rotary(probe, positions, kind)  # kind: "sliding_attention" or "full_attention"


def _sandwich_block(layer: nn.Module, x: Tensor, attention: Attention) -> Tensor:
    # Gemma normalises each sub-layer's output too, before it joins the residual stream
    x = x + layer.post_attention_layernorm(attention(layer.input_layernorm(x)))
    return x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))


def _soft_capped(logits: Tensor, config: Any) -> Tensor:
    cap = config.final_logit_softcapping
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap  # as the model's forward: (-cap, cap)


def _gemma3_unsupported(config: Any) -> str | None:
    if config.attn_logit_softcapping is not None:
        return f"attn_logit_softcapping = {config.attn_logit_softcapping} (soft-capped attention)"
    if config.use_bidirectional_attention:
        return "use_bidirectional_attention = True (not a causal model)"
    return None


LLAMA = Family(_one_kind, _one_set, _pre_norm_block, _uncapped, _nothing_unsupported)
GEMMA3 = Family(_layer_types, _set_per_kind, _sandwich_block, _soft_capped, _gemma3_unsupported)

FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA,
    "gemma3_text": GEMMA3,
}
"""config.model_type -> its family: the model types the lean engine runs."""
