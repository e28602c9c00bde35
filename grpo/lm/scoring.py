"""Scoring completions with a causal LM: per-token log-probs, mask and entropy.

Follows seeds 001 and 003: one forward pass over the left-padded prompt
followed by the right-padded completion; the logits at position t score token
t + 1 (`grpo.functional.completion_logprobs`), divided by the sampling
temperature. Position ids count real tokens only, so a row scores the same
with or without left padding (absolute-position models such as GPT-2 need
this; rotary ones are shift-invariant anyway).

Choices:
- The completion mask ends at the first EOS (counted); later tokens never
  count and get log-prob 0 through `torch.where`, so no gradient reaches them.
  `mask_truncated_completions` masks whole completions that hit
  max_new_tokens without finishing (DAPO's overlong filtering, Yu et al. 2025).
- Only the last T + 1 logits are computed (`logits_to_keep`) where the model
  supports it, and rows go through in micro-batches, to bound memory.
- With `chunked_output_layer` the model's body runs alone and its output layer
  is folded into the log-softmax (`grpo.functional.output_layer`), chunk by
  chunk, so no (n, T, V) logits exist: for large vocabularies. That the
  model's logits are exactly its output layer applied to its last hidden
  states (no soft-capping or scaling) is checked on the first micro-batch; a
  model sharded by FSDP2 is refused, since only its own forward gathers the
  shards.

Everything scoring needs arrives explicitly (`ScoringSettings`, which
`CausalLMPolicy.scoring_settings()` builds), and what it measures is returned,
not stored: `model` is the network to run, which for a LoRA reference is the
same PEFT model with its adapters disabled.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.functional.logprobs import completion_logprobs, entropy_from_logits
from grpo.functional.output_layer import output_layer_entropy, output_layer_logprobs
from grpo.lm.completion import Completion
from grpo.lm.sampling import left_pad
from grpo.protocols import TokenLogProbs

__all__ = ["ScoringSettings", "score_completions"]

# models whose logits were checked to be their output layer of their last hidden states
_FOLDING_CHECKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


class ScoringSettings(NamedTuple):
    """What scoring a causal LM's completions depends on."""

    pad_token_id: int
    eos_token_ids: tuple[int, ...]  # a completion's mask ends at the first of these (counted)
    temperature: float  # the sampling temperature: log-probs are of the sampled distribution
    micro_batch_size: int  # rows per forward pass
    compute_entropy: bool
    chunked_output_layer: bool
    mask_truncated_completions: bool


def score_completions(
    model: nn.Module, actions: Sequence[Completion], settings: ScoringSettings
) -> tuple[TokenLogProbs, dict[str, float]]:
    """Score `actions` with `model` in micro-batches -> (TokenLogProbs padded to the longest T,
    metrics): "entropy/mean" over counted tokens when the entropy is computed."""
    for n, action in enumerate(actions):
        if not isinstance(action, Completion):
            raise TypeError(f"action {n}: got {type(action).__name__}; allowed: Completion")
    T = max([a.num_tokens for a in actions] + [1])
    step = settings.micro_batch_size
    parts = [
        _score_micro_batch(model, actions[s : s + step], settings)
        for s in range(0, len(actions), step)
    ]
    logprobs = torch.cat([F.pad(p[0], (0, T - p[0].shape[1])) for p in parts])  # (N, T)
    mask = torch.cat([F.pad(p[1], (0, T - p[1].shape[1])) for p in parts])  # (N, T)
    entropy, metrics = None, {}
    if settings.compute_entropy:
        entropy = torch.cat([F.pad(p[2], (0, T - p[2].shape[1])) for p in parts])  # (N, T)
        counted = mask.sum().clamp(min=1)
        metrics["entropy/mean"] = float((entropy.detach() * mask).sum() / counted)
    return TokenLogProbs(logprobs, mask, entropy), metrics


def _score_micro_batch(
    model: nn.Module, actions: Sequence[Completion], settings: ScoringSettings
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One forward over [left-padded prompt | right-padded completion] -> (n, T) each."""
    pad = settings.pad_token_id
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = left_pad([a.prompt_ids for a in actions], pad)  # (n, P)
    T = max([a.num_tokens for a in actions] + [1])
    completion_ids = torch.full((len(actions), T), pad, dtype=torch.long)  # (n, T) right-padded
    present = torch.zeros((len(actions), T), dtype=torch.long)  # (n, T) 1 = a real token
    for i, a in enumerate(actions):
        completion_ids[i, : a.num_tokens] = torch.tensor(a.completion_ids, dtype=torch.long)
        present[i, : a.num_tokens] = 1
    input_ids = torch.cat([prompt_ids, completion_ids], 1).to(device)  # (n, P+T)
    attention_mask = torch.cat([prompt_mask, present], 1).to(device)  # (n, P+T)
    # positions count real tokens only, so left padding does not shift them
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (n, P+T)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    completion_ids = completion_ids.to(device)
    score = _score_folded if settings.chunked_output_layer else _score_logits
    logprobs, entropy = score(model, inputs, completion_ids, settings)  # (n, T) each
    mask = _completion_mask(actions, completion_ids, present.to(device), settings)  # (n, T)
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))  # no gradient past EOS
    if entropy is not None:
        entropy = torch.where(mask, entropy, torch.zeros_like(entropy))  # (n, T)
    return logprobs, mask, entropy


def _keeps_logits(model: nn.Module) -> bool:
    """True when the model's forward can compute the last k logits only (`logits_to_keep`)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _score_logits(
    model: nn.Module, inputs: dict[str, Tensor], completion_ids: Tensor, settings: ScoringSettings
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) from the model's own logits of the last T + 1 positions."""
    T = completion_ids.shape[1]
    keep = {"logits_to_keep": T + 1} if _keeps_logits(model) else {}
    logits = model(**inputs, use_cache=False, **keep).logits  # (n, T+1, V) or (n, P+T, V)
    temperature = settings.temperature
    logprobs = completion_logprobs(logits, completion_ids, temperature)  # (n, T)
    entropy = None
    if settings.compute_entropy:
        scoring = logits[:, logits.shape[1] - T - 1 : -1]  # (n, T, V) same shift as the log-probs
        entropy = entropy_from_logits(scoring, temperature)
    return logprobs, entropy


def _score_folded(
    model: nn.Module, inputs: dict[str, Tensor], completion_ids: Tensor, settings: ScoringSettings
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) from the last hidden states and the output layer, in row
    chunks (`grpo.functional.output_layer`): no (n, T, V) logits tensor is ever made."""
    T = completion_ids.shape[1]
    body, head = _body_and_head(model)
    hidden = body(**inputs, use_cache=False).last_hidden_state  # (n, P+T, H)
    if model not in _FOLDING_CHECKED:
        _check_folding(model, inputs, hidden, head)
        _FOLDING_CHECKED.add(model)
    scoring = hidden[:, hidden.shape[1] - T - 1 : -1]  # (n, T, H) position t scores token t+1
    folded = {"bias": head.bias, "temperature": settings.temperature}
    logprobs = output_layer_logprobs(scoring, head.weight, completion_ids, **folded)  # (n, T)
    entropy = None
    if settings.compute_entropy:
        entropy = output_layer_entropy(scoring, head.weight, **folded)  # (n, T)
    return logprobs, entropy


def _body_and_head(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """The transformer body (hidden states out) and the output layer of a causal LM."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    body = getattr(inner, "base_model", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if body is None or body is inner or type(head) is not nn.Linear:
        raise ValueError(
            "chunked_output_layer: needs a transformers causal LM whose output layer is a plain "
            f"nn.Linear (got {type(head).__name__} on {type(inner).__name__}; a LoRA adapter on "
            "the output layer is not supported); set chunked_output_layer: false"
        )
    if hasattr(head.weight, "full_tensor"):  # a DTensor: only the root's forward gathers it
        raise ValueError(
            "chunked_output_layer: the output layer is sharded (FSDP2), and running the body and "
            "the output layer apart skips the gathering of the model's own forward; use "
            "distributed strategy ddp or set chunked_output_layer: false"
        )
    return body, head


def _check_folding(
    model: nn.Module, inputs: dict[str, Tensor], hidden: Tensor, head: nn.Linear
) -> None:
    """The model's own logits of one row must be its output layer applied to its hidden states
    (not so with logit soft-capping or scaling); checked once per model."""
    with torch.no_grad():
        row = {key: value[:1] for key, value in inputs.items()}
        expected = model(**row, use_cache=False).logits[0, -1].float()  # (V,)
        folded = head(hidden[:1, -1]).float()[0]  # (V,)
    gap = (expected - folded).abs().max().item()
    if gap > 1e-3 * (1.0 + expected.abs().max().item()):
        raise ValueError(
            "chunked_output_layer: this model's logits are not its output layer applied to its "
            f"last hidden states (largest difference {gap:.3g}; e.g. logit soft-capping or "
            "scaling); set chunked_output_layer: false"
        )


def _completion_mask(
    actions: Sequence[Completion], completion_ids: Tensor, present: Tensor, settings: ScoringSettings
) -> Tensor:
    """True up to and including the first EOS of each real completion -> (n, T) bool."""
    is_eos = torch.isin(
        completion_ids, torch.tensor(settings.eos_token_ids, device=completion_ids.device)
    )
    is_eos = is_eos & present.bool()  # (n, T)
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # (n, T) EOS strictly before t
    mask = present.bool() & (eos_before == 0)  # (n, T)
    if settings.mask_truncated_completions:
        truncated = torch.tensor([a.truncated for a in actions], device=mask.device)  # (n,)
        mask = mask & ~truncated[:, None]
    return mask
