"""Scoring rows that continue the same prompt: each distinct prompt runs once, its cache serves all.

In GRPO every prompt is scored G times (sample n = i * G + j), and the plain
forward of `scoring.py` computes the same prompt activations G times over.
Here the distinct prompts of a micro-batch run once, with a KV cache (and with
gradient when gradients are enabled); the cache is indexed along the batch
dimension to one copy per row, so backward sums the rows' gradients into the
shared prompt activations; then the completions run against it.

The result equals the plain forward's to float rounding: every token sits at
the same position (position ids count real tokens only, as in the plain
forward) and attends to the same keys (the attention mask covers prompt and
completion). The causal shift straddles the two passes: the prompt pass's last
position scores the first completion token, the completion pass's positions
score the others, and the last completion token is never fed in (it would only
score the token after the completion).

It applies where it was checked to be exact, and the plain forward runs
otherwise, its reason logged once (`sharing_blocker`):
- model types in `SHARED_PREFIX_MODEL_TYPES` (tested: Llama, Mistral, Qwen2,
  Qwen3, GPT-2, Gemma 3 with its sliding-window and global layers, with or
  without LoRA); a PEFT model with prompt learning
  (virtual tokens in the cache) never;
- not in a gradient pass with gradient checkpointing, where transformers
  drops the cache inside checkpointed layers;
- not with parameters sharded by FSDP2 (not tested with two forwards per
  backward);
- on its first shared micro-batch a model is compared with the plain forward
  on a few rows (`agrees_once`); a gap past the dtype's rounding (an attention
  kernel that mishandles a padded cache, say) turns sharing off for it.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from grpo.lm.sampling import left_pad
from grpo.precision import compute_dtype

__all__ = [
    "SHARED_PREFIX_MODEL_TYPES",
    "SharedPrompts",
    "agrees_once",
    "cache_argument",
    "group_prompts",
    "inner_model",
    "prompt_pass",
    "shared_prompt_forward",
    "sharing_blocker",
]

SHARED_PREFIX_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma3_text")

log = logging.getLogger(__name__)

# largest |shared - plain| gap accepted on first use, relative to max |plain| + 1
_CHECK_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}
_HALF_TOLERANCE = 5e-2  # bfloat16 / float16
_CHECK_ROWS = 8

# model -> None (checked, agrees with the plain forward) or why it does not
_CHECKED: weakref.WeakKeyDictionary[nn.Module, str | None] = weakref.WeakKeyDictionary()
_LOGGED: set[str] = set()


class SharedPrompts(NamedTuple):
    """The distinct prompts of n rows."""

    ids: Tensor  # (u, P) long, left-padded, in order of first appearance
    mask: Tensor  # (u, P) long, 1 = a real token
    index: Tensor  # (n,) long, the distinct prompt each row continues


def group_prompts(prompt_rows: Sequence[Sequence[int]], pad_id: int) -> SharedPrompts:
    """Group rows by identical prompt ids -> the u <= n distinct prompts, left-padded."""
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(row), len(distinct)) for row in prompt_rows]
    ids, mask = left_pad(list(distinct), pad_id)  # (u, P): the longest prompt is among them
    return SharedPrompts(ids, mask, torch.tensor(index, dtype=torch.long))


def inner_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model


def cache_argument(model: nn.Module) -> str | None:
    """The name under which the model's forward takes a KV cache ("cache" from transformers
    5.x, "past_key_values" before), or None when it takes none."""
    parameters = inspect.signature(inner_model(model).forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def sharing_blocker(model: nn.Module) -> str | None:
    """Why the shared-prompt forward cannot run on `model` now (see the module docstring),
    or None when it can; the reason is logged the first time it is given."""
    reason = _blocker(model)
    if reason is not None and reason not in _LOGGED:
        _LOGGED.add(reason)
        log.info("share_prompt_prefix: the plain forward scores instead: %s", reason)
    return reason


def _blocker(model: nn.Module) -> str | None:
    inner = inner_model(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    if model_type not in SHARED_PREFIX_MODEL_TYPES:
        allowed = ", ".join(SHARED_PREFIX_MODEL_TYPES)
        return f"model type {model_type!r} is not one it was checked on ({allowed})"
    if cache_argument(model) is None:
        return f"{type(inner).__name__}.forward takes no KV cache"
    config = getattr(model, "active_peft_config", None)
    if getattr(config, "is_prompt_learning", False):
        return "a PEFT prompt-learning model puts virtual tokens in the cache"
    checkpointed = any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    if checkpointed and model.training and torch.is_grad_enabled():
        return "gradient checkpointing drops the KV cache in the gradient pass"
    if hasattr(next(model.parameters()), "full_tensor"):  # a DTensor
        return "the parameters are sharded (FSDP2)"
    return _CHECKED.get(model)


def prompt_pass(
    net: nn.Module,
    prompts: SharedPrompts,
    output: Callable[[Any], Tensor],
    prompt_kwargs: dict[str, Any],
    device: torch.device,
) -> tuple[Any, Tensor, SharedPrompts]:
    """The u distinct prompts run once with a KV cache -> (the forward's output, what scores
    each row's first completion token (n, 1, X), the prompts on `device`)."""
    ids, mask, index = (t.to(device) for t in prompts)  # (u, P), (u, P), (n,)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (u, P) left padding shifts nothing
    out = net(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
              **prompt_kwargs)  # fmt: skip
    # the last prompt position scores the first completion token; indexing the rows'
    # copies makes backward sum their gradients into the one prompt pass
    first = output(out)[:, -1:].index_select(0, index)  # (n, 1, X)
    return out, first, SharedPrompts(ids, mask, index)


def shared_prompt_forward(
    net: nn.Module,
    prompts: SharedPrompts,
    completion_ids: Tensor,
    present: Tensor,
    output: Callable[[Any], Tensor],
    prompt_kwargs: dict[str, Any],
    cache_name: str,
) -> Tensor:
    """What scores each completion token -> (n, T, X): `output` of a forward (the logits,
    X = V, or the last hidden states, X = H) at the position before each token.

    `net` runs once over the u distinct prompts (`prompt_kwargs` added, e.g. to keep the
    last logits only), then over the n completions (n, T) right-padded, `present` (n, T)
    1 = a real token, against the prompts' cache expanded to the rows.
    """
    out, first, (ids, mask, index) = prompt_pass(net, prompts, output, prompt_kwargs,
                                                 completion_ids.device)  # fmt: skip
    T = completion_ids.shape[1]
    if T == 1:
        return first
    cache = getattr(out, cache_name)
    cache.batch_select_indices(index)  # every layer's keys, values (u, kv, P, D) -> (n, kv, P, D)
    full_mask = torch.cat([mask.index_select(0, index), present[:, : T - 1]], 1)  # (n, P+T-1)
    # each completion continues its own prompt's count of real tokens, as in the plain forward
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, ids.shape[1] :]  # (n, T-1)
    out = net(
        input_ids=completion_ids[:, :-1],  # the last token scores nothing: never fed in
        attention_mask=full_mask,
        position_ids=positions,
        use_cache=True,
        **{cache_name: cache},
    )
    return torch.cat([first, output(out)], 1)  # (n, T, X)


def agrees_once(
    model: nn.Module,
    shared: Tensor,
    plain: Callable[[Tensor], Tensor],
    present: Tensor,
    checks: weakref.WeakKeyDictionary[nn.Module, str | None] | None = None,
) -> bool:
    """On a model's first shared micro-batch: do a few of its rows, shared (n, T, X), equal the
    plain forward `plain(rows) -> (k, T, X)` to the dtype's rounding at real tokens? If not,
    sharing stays off for this model (logged). True afterwards once it agreed. `checks`: where
    the outcome is kept (default: sharing's own; packing keeps its own)."""
    checks = _CHECKED if checks is None else checks
    if model in checks:
        return checks[model] is None
    n = shared.shape[0]
    rows = torch.linspace(0, n - 1, min(n, _CHECK_ROWS)).round().long().unique()  # (k,) spread
    rows = rows.to(shared.device)
    with torch.no_grad():
        want = plain(rows).float()  # (k, T, X)
    real = present.index_select(0, rows).bool()  # (k, T)
    got = shared.detach().index_select(0, rows).float()
    gap = 0.0
    if real.any():
        gap = ((got - want).abs()[real].max() / (want[real].abs().max() + 1)).item()
    dtype = compute_dtype(shared.dtype, shared.device.type)  # bfloat16 under bf16-mixed
    tolerance = _CHECK_TOLERANCE.get(dtype, _HALF_TOLERANCE)
    checks[model] = None
    if not gap <= tolerance:
        checks[model] = (
            f"on {type(inner_model(model)).__name__} it differs from the plain forward by "
            f"{gap:.2e} (relative; allowed {tolerance:.0e})"
        )
        if checks is _CHECKED:
            sharing_blocker(model)  # logs the reason once (packing's blocker logs its own)
    return checks[model] is None
