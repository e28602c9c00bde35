"""Scoring completions with a causal LM: per-token log-probs, mask and entropy.

Follows the chess loop and picoRL: one forward pass over the left-padded prompt
followed by the right-padded completion; the logits at position t score token
t + 1 (the causal shift of `grpo.functional.completion_logprobs`), divided by
the sampling temperature. Position ids count real tokens only, so a row scores
the same with or without left padding (absolute-position models such as GPT-2
need this; rotary ones are shift-invariant anyway).

Choices:
- Rows of a micro-batch that continue the same prompt (a group's G samples)
  share one forward over it (`share_prompt_prefix`, `grpo.lm.prefix`): the
  distinct prompts run once with a KV cache, the completions against it; the
  same log-probs and gradients to float rounding. A micro-batch whose prompts
  all differ, and models or settings where sharing does not apply (logged
  once), get the plain forward. With `pack_completions` the completions run
  end to end in one row instead of right-padded to the longest
  (`grpo.lm.packing`), where the model's attention allows it.
- The completion mask ends at the first EOS (counted); later tokens never
  count and get log-prob 0 through `torch.where`, so no gradient reaches them.
  `mask_truncated_completions` masks whole completions that hit
  max_new_tokens without finishing (DAPO's overlong filtering, Yu et al. 2025).
- With `precision` bf16-mixed the model's forward runs under bfloat16
  autocast (`grpo.precision`): its logits come out in bfloat16, and the
  log-softmax, entropy and everything after run in float32. With
  `chunked_output_layer` the body runs under autocast and the folded output
  layer multiplies in the same dtype (`grpo.precision.compute_dtype`: bfloat16
  under bf16-mixed, the weight's own otherwise, bfloat16 for bf16-copy's copy),
  its softmax in float32.
- Only the last T + 1 logits are computed (`logits_to_keep`) where the model
  supports it, and rows go through in micro-batches, to bound memory.
- When the output layer is folded (`chunked_output_layer`; by default for
  vocabularies of at least `grpo.lm.folding.AUTO_MIN_VOCAB` tokens) the
  model's body runs alone and its output layer is folded into the log-softmax
  (`grpo.functional.output_layer`), chunk by chunk, so no (n, T, V) logits
  exist; it runs at real completion tokens only (not at the padding of the
  shorter rows), and one computation of each chunk's logits serves both
  log-probs and entropy. Whether a model can be folded is checked once
  (`grpo.lm.folding`).

Everything scoring needs arrives explicitly (`ScoringSettings`, which
`CausalLMPolicy.scoring_settings()` builds), and what it measures is returned,
not stored: `model` is the network to run, which for a LoRA reference is the
same PEFT model with its adapters disabled.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.functional.logprobs import entropy_from_logits, selective_log_softmax
from grpo.functional.output_layer import output_layer_logprobs, output_layer_logprobs_entropy
from grpo.lm.completion import Completion
from grpo.lm.folding import folded_output_layer
from grpo.lm.packing import PACKING_CHECKS, packed_prompt_forward, packing_blocker
from grpo.lm.prefix import (
    SharedPrompts,
    agrees_once,
    cache_argument,
    group_prompts,
    shared_prompt_forward,
    sharing_blocker,
)
from grpo.lm.sampling import left_pad
from grpo.precision import cast_once, compute_dtype, compute_precision
from grpo.protocols import TokenLogProbs

__all__ = ["ScoringSettings", "score_completions"]


class ScoringSettings(NamedTuple):
    """What scoring a causal LM's completions depends on."""

    pad_token_id: int
    eos_token_ids: tuple[int, ...]  # a completion's mask ends at the first of these (counted)
    temperature: float  # the sampling temperature: log-probs are of the sampled distribution
    micro_batch_size: int  # rows per forward pass
    compute_entropy: bool
    chunked_output_layer: bool | str  # fold the output layer: true, false or "auto"
    mask_truncated_completions: bool
    share_prompt_prefix: bool = True  # rows with one prompt share its forward (grpo.lm.prefix)
    pack_completions: bool = False  # and their completions run end to end (grpo.lm.packing)
    precision: str = "fp32"  # the model's forward (grpo.precision.PRECISIONS); log-probs fp32


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
    share = settings.share_prompt_prefix and sharing_blocker(model) is None
    parts = [
        _score_micro_batch(model, actions[s : s + step], settings, share)
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


class _Rows(NamedTuple):
    """One micro-batch of rows, ready for the model."""

    inputs: dict[str, Tensor]  # input_ids, attention_mask, position_ids (n, P+T)
    completion_ids: Tensor  # (n, T) right-padded
    present: Tensor  # (n, T) long, 1 = a real completion token
    prompts: SharedPrompts | None  # the distinct prompts, when rows share them and sharing applies


def _score_micro_batch(
    model: nn.Module, actions: Sequence[Completion], settings: ScoringSettings, share: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One forward over [left-padded prompt | right-padded completion] (or the shared-prompt
    forward: `grpo.lm.prefix`) -> (n, T) each."""
    rows = _rows(model, actions, settings, share)
    folded = folded_output_layer(model, settings.chunked_output_layer, rows.inputs)
    if folded is None:
        logprobs, entropy = _score_logits(model, rows, settings)  # (n, T) each
    else:
        logprobs, entropy = _score_folded(model, *folded, rows, settings)  # (n, T) each
    mask = _completion_mask(actions, rows.completion_ids, rows.present, settings)  # (n, T)
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))  # no gradient past EOS
    if entropy is not None:
        entropy = torch.where(mask, entropy, torch.zeros_like(entropy))  # (n, T)
    return logprobs, mask, entropy


def _rows(
    model: nn.Module, actions: Sequence[Completion], settings: ScoringSettings, share: bool
) -> _Rows:
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
    prompts = group_prompts([a.prompt_ids for a in actions], pad) if share else None
    if prompts is not None and len(prompts.ids) == len(actions):
        prompts = None  # nothing repeats: one plain forward does the same work in one call
    return _Rows(inputs, completion_ids.to(device), present.to(device), prompts)


def _keeps_logits(model: nn.Module) -> bool:
    """True when the model's forward can compute the last k logits only (`logits_to_keep`)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def _scoring_states(
    model: nn.Module,
    net: nn.Module,
    rows: _Rows,
    output: Callable[[Any], Tensor],
    keep: bool,
    pack: bool,
) -> Tensor:
    """`output` of `net`'s forward at the positions that score the completion tokens ->
    (n, T, X): position t scores token t + 1. `keep`: `net` takes `logits_to_keep`; `pack`:
    completions sharing prompts run end to end where they can (`grpo.lm.packing`)."""
    T = rows.completion_ids.shape[1]

    def plain(index: Tensor | None = None) -> Tensor:
        """One forward over whole rows (those at `index`, else all)."""
        inputs = rows.inputs
        if index is not None:
            inputs = {key: value.index_select(0, index) for key, value in inputs.items()}
        last = {"logits_to_keep": T + 1} if keep else {}
        states = output(net(**inputs, use_cache=False, **last))  # (n, T+1, X) or (n, P+T, X)
        return states[:, states.shape[1] - T - 1 : -1]  # (n, T, X)

    if rows.prompts is None:
        return plain()
    last = {"logits_to_keep": 1} if keep else {}
    shared_rows = (net, rows.prompts, rows.completion_ids, rows.present, output, last,
                   cache_argument(model))  # fmt: skip
    if pack and packing_blocker(model, rows.inputs["input_ids"].shape[1]) is None:
        packed = packed_prompt_forward(*shared_rows)  # (n, T, X)
        if agrees_once(model, packed, plain, rows.present, PACKING_CHECKS):
            return packed
    shared = shared_prompt_forward(*shared_rows)  # (n, T, X)
    return shared if agrees_once(model, shared, plain, rows.present) else plain()


def _score_logits(
    model: nn.Module, rows: _Rows, settings: ScoringSettings
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) from the model's own logits, only those of the positions that
    score a completion token where the model can keep the last few only."""
    with compute_precision(settings.precision, rows.completion_ids.device.type):
        keep = _keeps_logits(model)
        scoring = _scoring_states(
            model, model, rows, lambda out: out.logits, keep, settings.pack_completions
        )  # (n, T, V)
    temperature = settings.temperature
    logprobs = selective_log_softmax(scoring, rows.completion_ids, temperature=temperature)
    entropy = None
    if settings.compute_entropy:
        entropy = entropy_from_logits(scoring, temperature)  # (n, T)
    return logprobs, entropy


def _score_folded(
    model: nn.Module, body: nn.Module, head: nn.Linear, rows: _Rows, settings: ScoringSettings
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropy) from the last hidden states of `body` and the output layer
    `head`, in row chunks (`grpo.functional.output_layer`): no (n, T, V) logits tensor, and
    the output layer runs at real completion tokens only, not at the padding after them. Its
    products that read the weight run in the precision's dtype (bfloat16 under bf16-mixed,
    from a cast kept until the weight changes, and bf16-copy), its softmax in float32."""
    device = rows.completion_ids.device.type
    with compute_precision(settings.precision, device):
        scoring = _scoring_states(
            model, body, rows, lambda out: out.last_hidden_state, False, settings.pack_completions
        )  # (n, T, H)
        product = compute_dtype(head.weight.dtype, device)  # (autocast's, else the weight's)
    real = rows.present.bool()  # (n, T): the output layer skips the padding
    folded = {"bias": head.bias, "temperature": settings.temperature, "where": real,
              "product_weight": cast_once(head.weight, product)}  # fmt: skip
    ids = rows.completion_ids
    if settings.compute_entropy:
        return output_layer_logprobs_entropy(scoring, head.weight, ids, **folded)  # (n, T) each
    return output_layer_logprobs(scoring, head.weight, ids, **folded), None  # (n, T)


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
