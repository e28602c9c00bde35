"""`LowPrecisionCopy`: a low-precision copy of a float32 model for sampling, refreshed per rollout.

The lean engine samples under `rollout.precision: bf16-mixed` with a copy of
the model whose matrices (weights of two or more dimensions) are bfloat16:
one cast per rollout, where autocast would cast every weight at every decoding
step. Vectors (norm weights, biases) and buffers (rotary frequencies) stay
float32. The copy holds no gradients.

A LoRA model's copy is the plain model with its adapters merged in: each
adapted layer's weight (linear or embedding) is W + (alpha / r) B A,
recomputed from the current adapters at every refresh (peft's
`get_delta_weight`), so decoding runs one matrix product per layer instead of
the base layer and two adapter products (and peft's module dispatch) at every
token. A weight the model ties to another (SmolLM2's output layer is its
embedding) gets its own tensor in the copy when either side carries an
adapter: the model applies that adapter on one side only.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from grpo.lm.engines.weights import merged_lora_weight
from grpo.lm.loading import is_peft_model

__all__ = ["LowPrecisionCopy"]


class LowPrecisionCopy:
    """A copy of a float32 model with its matrices in `dtype`, adapters merged (see above).

    `pairs`: (copy's, model's) parameter, copied as they are; `merged`: (copy's weight,
    the model's LoRA layer) whose merged weight is computed at each `refresh()`.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        if is_peft_model(model):
            self.model = copy.deepcopy(model).merge_and_unload()  # a plain model, no adapters
            source = model.get_base_model()  # its modules carry the names the copy's have
            _untie_adapted(self.model, source)
        else:
            self.model, source = copy.deepcopy(model), model
        self.model.requires_grad_(False)
        self.pairs: list[tuple[Tensor, Tensor]] = []
        self.merged: list[tuple[Tensor, nn.Module]] = []
        for name, mine in self.model.named_parameters():
            path, _, leaf = name.rpartition(".")
            owner = source.get_submodule(path)
            if not hasattr(owner, "base_layer"):
                self.pairs.append((mine, getattr(owner, leaf)))
            elif leaf == "weight":  # a LoRA layer's weight: the adapters merged in
                self.merged.append((mine, owner))
            else:
                self.pairs.append((mine, getattr(owner.base_layer, leaf)))
            if mine.dim() >= 2:
                mine.data = mine.data.to(dtype)

    def refresh(self) -> None:
        """Copy (and cast) the model's current weights, adapters merged, into the copy."""
        with torch.no_grad():
            for mine, theirs in self.pairs:
                mine.copy_(theirs)
            for mine, layer in self.merged:
                mine.copy_(merged_lora_weight(layer))  # (out, in)


def _untie_adapted(plain: nn.Module, source: nn.Module) -> None:
    """Where modules of `plain` share a weight and any of them is a LoRA layer in `source`
    (the LoRA model), give every module but the first its own copy of it."""
    tied: dict[int, list[str]] = {}
    for name, p in plain.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    for names in tied.values():
        if len(names) > 1 and any(_is_lora(source, name) for name in names):
            for name in names[1:]:
                path, _, leaf = name.rpartition(".")
                module = plain.get_submodule(path)
                setattr(module, leaf, nn.Parameter(getattr(module, leaf).detach().clone()))


def _is_lora(source: nn.Module, name: str) -> bool:
    """Whether the module owning parameter `name` is a LoRA layer in `source`."""
    return hasattr(source.get_submodule(name.rpartition(".")[0]), "base_layer")
