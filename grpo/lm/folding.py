"""Whether scoring folds a causal LM's output layer into the log-softmax (`chunked_output_layer`).

Folding (`grpo.functional.output_layer`) runs the model's body alone and
multiplies its last hidden states by the output weight one chunk of rows at a
time, so no (n, T, V) logits tensor exists. It is exact only when the model's
logits are its output layer applied to its last hidden states, and it needs
that layer whole on this process. The setting has three values:

- `true`: always fold; a model that cannot be folded is an error naming why;
- `false`: never fold (the model's own logits, as its forward returns them);
- `"auto"` (the default): fold when the vocabulary has at least
  `AUTO_MIN_VOCAB` tokens and the model can be folded; otherwise the logits
  path, the reason logged once when the vocabulary was large enough.

Why a vocabulary threshold: the saving is the logits, n x T x V floats and
their gradient; the cost is one more (rows x H) x (H x V) matmul per chunk in
backward, where the logits path keeps the logits instead. With a small
vocabulary the logits are a small part of a step's memory and folding only
adds work; from a few tens of thousands of tokens (Llama 3, Qwen, SmolLM,
GPT-2) they are the largest tensor of the scoring passes (docs/performance.md).

What can be folded, checked once per model: a transformers causal LM whose
output embedding is a plain `nn.Linear` (no LoRA on it), not sharded by FSDP2
(only the sharded model's own forward gathers it), and whose logits of one
probe row equal that layer applied to its last hidden states (not so with
logit soft-capping or scaling).
"""

from __future__ import annotations

import inspect
import logging
import weakref
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["AUTO_MIN_VOCAB", "FOLDING_MODES", "check_folding_mode", "folded_output_layer"]

log = logging.getLogger(__name__)

AUTO_MIN_VOCAB = 32768
"""`"auto"` folds output layers of at least this many tokens (see the module docstring)."""

FOLDING_MODES = (True, False, "auto")

# model -> None when it can be folded, else why not (checked once per model)
_BLOCKERS: weakref.WeakKeyDictionary[nn.Module, str | None] = weakref.WeakKeyDictionary()
_LOGGED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models whose 'auto' fallback was logged


def check_folding_mode(value: Any, key: str = "chunked_output_layer") -> bool | str:
    """`value` if it is one of `FOLDING_MODES`, else a ValueError naming `key`."""
    if not (value is True or value is False or value == "auto"):
        raise ValueError(f"{key}: got {value!r}; allowed: true, false or 'auto'")
    return value


def folded_output_layer(
    model: nn.Module, mode: bool | str, inputs: dict[str, Tensor]
) -> tuple[nn.Module, nn.Linear] | None:
    """(body, output layer) when scoring `model` should fold its output layer, else None.

    `inputs`: model inputs of at least one row (n, L), for the one-time check that the
    model's logits are its output layer of its last hidden states. Raises for `mode`
    true when the model cannot be folded.
    """
    if mode is False:
        return None
    head = _output_layer(model)
    if mode == "auto" and _vocab_size(head) < AUTO_MIN_VOCAB:
        return None
    if model not in _BLOCKERS:
        _BLOCKERS[model] = _blocker(model, head, inputs)
    reason = _BLOCKERS[model]
    if reason is None:
        return _body(model), head
    if mode is True:
        raise ValueError(f"chunked_output_layer: {reason}; set chunked_output_layer: false")
    if model not in _LOGGED:
        _LOGGED.add(model)
        log.info("chunked_output_layer 'auto': scoring uses the model's logits: %s", reason)
    return None


def _inner(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model


def _output_layer(model: nn.Module) -> Any:
    inner = _inner(model)
    return inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None


def _vocab_size(head: Any) -> int:
    """Rows of the output layer's weight (V), 0 when there is no such weight."""
    weight = getattr(head, "weight", None)
    return weight.shape[0] if isinstance(weight, Tensor) and weight.dim() == 2 else 0


def _body(model: nn.Module) -> nn.Module:
    return _inner(model).base_model


def _blocker(model: nn.Module, head: Any, inputs: dict[str, Tensor]) -> str | None:
    """Why `model`'s output layer cannot be folded, or None when it can."""
    inner = _inner(model)
    body = getattr(inner, "base_model", None)
    if body is None or body is inner or type(head) is not nn.Linear:
        return (
            "needs a transformers causal LM whose output layer is a plain nn.Linear (got "
            f"{type(head).__name__} on {type(inner).__name__}; a LoRA adapter on the output "
            "layer is not supported)"
        )
    if hasattr(head.weight, "full_tensor"):  # a DTensor: only the root's forward gathers it
        return (
            "the output layer is sharded (FSDP2), and running the body and the output layer "
            "apart skips the gathering of the model's own forward; use distributed strategy ddp"
        )
    gap, scale = _folding_gap(model, body, head, inputs)
    if gap > 1e-3 * (1.0 + scale):
        return (
            "this model's logits are not its output layer applied to its last hidden states "
            f"(largest difference {gap:.3g}; e.g. logit soft-capping or scaling)"
        )
    return None


def _folding_gap(
    model: nn.Module, body: nn.Module, head: nn.Linear, inputs: dict[str, Tensor]
) -> tuple[float, float]:
    """Largest |logit - output layer(hidden)| at the last position of the first row, and the
    largest |logit| there."""
    keeps = "logits_to_keep" in inspect.signature(_inner(model).forward).parameters
    keep = {"logits_to_keep": 1} if keeps else {}  # the last position's logits only
    with torch.no_grad():
        row = {key: value[:1] for key, value in inputs.items()}
        expected = model(**row, use_cache=False, **keep).logits[0, -1].float()  # (V,)
        hidden = body(**row, use_cache=False).last_hidden_state[0, -1]  # (H,)
        folded = head(hidden).float()  # (V,)
    return (expected - folded).abs().max().item(), expected.abs().max().item()
