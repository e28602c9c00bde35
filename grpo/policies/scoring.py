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

`policy` is a `CausalLMPolicy` (its tokenizer, settings, EOS ids); `model` is
the network to run, which for a LoRA reference is the same PEFT model with its
adapters disabled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.functional.logprobs import completion_logprobs, entropy_from_logits
from grpo.policies.completion import Completion
from grpo.policies.sampling import left_pad
from grpo.protocols import TokenLogProbs

__all__ = ["score_completions"]


def score_completions(
    policy: Any,
    model: nn.Module,
    states: Sequence[Any],
    actions: Sequence[Completion],
    *,
    record_metrics: bool = False,
) -> TokenLogProbs:
    """Score `actions` with `model` in micro-batches -> TokenLogProbs padded to the longest T.

    `record_metrics`: a no-grad pass (the rollout) stores its mean entropy in
    `policy.rollout_metrics`.
    """
    if len(states) != len(actions):
        raise ValueError(f"states and actions must align; got {len(states)} and {len(actions)}")
    for n, action in enumerate(actions):
        if not isinstance(action, Completion):
            raise TypeError(f"action {n}: got {type(action).__name__}; allowed: Completion")
    T = max([a.num_tokens for a in actions] + [1])
    step = policy.settings.micro_batch_size
    parts = [
        _score_micro_batch(policy, model, actions[s : s + step])
        for s in range(0, len(actions), step)
    ]
    logprobs = torch.cat([F.pad(p[0], (0, T - p[0].shape[1])) for p in parts])  # (N, T)
    mask = torch.cat([F.pad(p[1], (0, T - p[1].shape[1])) for p in parts])  # (N, T)
    entropy = None
    if policy.settings.compute_entropy:
        entropy = torch.cat([F.pad(p[2], (0, T - p[2].shape[1])) for p in parts])  # (N, T)
        if (
            record_metrics and not torch.is_grad_enabled()
        ):  # the rollout pass: report it as a metric
            counted = mask.sum().clamp(min=1)
            policy.rollout_metrics["entropy/rollout_mean"] = float((entropy * mask).sum() / counted)
    return TokenLogProbs(logprobs, mask, entropy)


def _score_micro_batch(
    policy: Any, model: nn.Module, actions: Sequence[Completion]
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One forward over [left-padded prompt | right-padded completion] -> (n, T) each."""
    pad = policy.tokenizer.pad_token_id
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
    keep = {"logits_to_keep": T + 1} if policy._keeps_logits else {}
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **keep,
    ).logits  # (n, T+1, V) or (n, P+T, V)
    temperature = policy.settings.generation.temperature
    completion_ids = completion_ids.to(device)
    logprobs = completion_logprobs(logits, completion_ids, temperature)  # (n, T)
    mask = _completion_mask(actions, completion_ids, present.to(device), policy)  # (n, T)
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))  # no gradient past EOS
    entropy = None
    if policy.settings.compute_entropy:
        scoring = logits[:, logits.shape[1] - T - 1 : -1]  # (n, T, V) same shift as the log-probs
        entropy = entropy_from_logits(scoring, temperature)
        entropy = torch.where(mask, entropy, torch.zeros_like(entropy))  # (n, T)
    return logprobs, mask, entropy


def _completion_mask(
    actions: Sequence[Completion], completion_ids: Tensor, present: Tensor, policy: Any
) -> Tensor:
    """True up to and including the first EOS of each real completion -> (n, T) bool."""
    is_eos = torch.isin(
        completion_ids, torch.tensor(policy.eos_token_ids, device=completion_ids.device)
    )
    is_eos = is_eos & present.bool()  # (n, T)
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # (n, T) EOS strictly before t
    mask = present.bool() & (eos_before == 0)  # (n, T)
    if policy.settings.mask_truncated_completions:
        truncated = torch.tensor([a.truncated for a in actions], device=mask.device)  # (n,)
        mask = mask & ~truncated[:, None]
    return mask
