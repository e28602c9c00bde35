"""Scoring a micro-batch's completions laid end to end in one row: no padding between them.

The shared-prompt forward (`grpo.lm.prefix`) runs the completions of a micro-batch as
(n, T) rows right-padded to the longest, so every row costs the longest completion; with
lengths spread out (a mean of 51 tokens and a longest of 127 is usual) most of that work is
padding. Here the distinct prompts run once with a KV cache as there, and then:
- the completion tokens that score something (each row's tokens but its last) are laid end
  to end in one row of L = sum over rows of (length - 1) tokens;
- the prompts' cached keys and values are laid end to end too, (u, kv, P, D) -> (1, kv, u P, D);
- a 4D attention mask (1, 1, L, u P + L) lets each token see its own prompt's real tokens and
  its own completion up to itself, nothing else;
- each token keeps its position of the plain forward (its prompt's real tokens, then its
  index in the completion).
So every token attends to the same keys at the same positions as in the plain forward, and
its output equals the plain forward's to float rounding; the matrix products run over L rows
instead of n (T - 1). The outputs are put back in (n, T, X) for the caller.

It applies where the shared-prompt forward does (`grpo.lm.prefix.sharing_blocker`) and the
model's attention takes a 4D mask as written here (`PACKED_ATTENTION`: "sdpa" takes it as
booleans, "eager" as an additive float mask), and a micro-batch packs only when a model with
a sliding window has every row (P + T tokens) inside it, so that the one mask serves every
layer. Elsewhere the padded shared forward runs; the reason is logged once. The first packed
micro-batch of a model is compared with the plain forward (`grpo.lm.prefix.agrees_once`, a
check of its own).

The idea is sequence packing with a block-diagonal mask, as in padding-free training
(Krell et al. 2021, "Efficient sequence packing without cross-contamination"); here each
packed sequence also attends to its own prompt in a shared cache.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from grpo.lm.prefix import SharedPrompts, inner_model, prompt_pass

__all__ = ["PACKED_ATTENTION", "PACKING_CHECKS", "packed_prompt_forward", "packing_blocker"]

PACKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take the packed 4D mask (transformers' names)."""

PACKING_CHECKS: weakref.WeakKeyDictionary[nn.Module, str | None] = weakref.WeakKeyDictionary()
"""model -> None (its first packed micro-batch agreed with the plain forward) or why not."""

log = logging.getLogger(__name__)
_LOGGED: set[str] = set()


def packing_blocker(model: nn.Module, row_tokens: int) -> str | None:
    """Why a micro-batch of rows of `row_tokens` tokens (P + T) cannot be packed for `model`,
    or None; each reason is logged the first time it is given. (Where sharing is blocked the
    caller does not ask.)"""
    config = getattr(inner_model(model), "config", None)
    attention = getattr(config, "_attn_implementation", None)
    reason = PACKING_CHECKS.get(model)
    if attention not in PACKED_ATTENTION:
        allowed = ", ".join(PACKED_ATTENTION)
        reason = f"attention {attention!r} is not one whose 4D mask it writes ({allowed})"
    window = getattr(config, "sliding_window", None)
    if reason is None and window is not None and row_tokens > window:
        reason = f"rows of {row_tokens} tokens pass the sliding window of {window}"
    if reason is not None and reason not in _LOGGED:
        _LOGGED.add(reason)
        log.info("pack_completions: the padded rows score instead: %s", reason)
    return reason


def packed_prompt_forward(
    net: nn.Module,
    prompts: SharedPrompts,
    completion_ids: Tensor,
    present: Tensor,
    output: Callable[[Any], Tensor],
    prompt_kwargs: dict[str, Any],
    cache_name: str,
) -> Tensor:
    """What scores each completion token -> (n, T, X), as `grpo.lm.prefix.shared_prompt_forward`
    returns it (0 where no token is scored), with the completions packed into one row.

    `net` runs over the u distinct prompts (`prompt_kwargs` added), then over the packed
    completion tokens against their cache; `present` (n, T) 1 = a real token.
    """
    attention = inner_model(net).config._attn_implementation  # one of PACKED_ATTENTION
    device = completion_ids.device
    out, first, (_, mask, index) = prompt_pass(net, prompts, output, prompt_kwargs, device)
    n, T = completion_ids.shape
    fed = present[:, 1:].bool()  # (n, T-1): token j is fed when token j + 1 is real
    if T == 1 or not bool(fed.any()):
        return torch.cat([first, first.new_zeros(n, T - 1, first.shape[-1])], 1)  # (n, T, X)
    rows = torch.arange(n, device=device)[:, None].expand(n, T - 1)[fed]  # (L,) its row
    offsets = torch.arange(T - 1, device=device)[None].expand(n, T - 1)[fed]  # (L,) in the row
    prompt_of = index[rows]  # (L,) the distinct prompt each packed token continues
    cache = getattr(out, cache_name)
    for layer in cache.layers:  # (u, kv, P, D) -> (1, kv, u P, D), prompt after prompt
        layer.keys, layer.values = _end_to_end(layer.keys), _end_to_end(layer.values)
    allowed = _packed_mask(mask.bool(), prompt_of, rows)  # (L, u P + L)
    packed = net(
        input_ids=completion_ids[:, :-1][fed][None],  # (1, L)
        attention_mask=_as_mask(allowed, attention),  # (1, 1, L, u P + L)
        position_ids=(mask.sum(-1)[prompt_of] + offsets)[None],  # (1, L): as in the plain forward
        use_cache=True,
        **{cache_name: cache},
    )
    states = output(packed)[0]  # (L, X)
    rest = states.new_zeros(n, T - 1, states.shape[-1]).masked_scatter(fed[..., None], states)
    return torch.cat([first, rest], 1)  # (n, T, X)


def _end_to_end(cached: Tensor) -> Tensor:
    """(u, kv, P, D) -> (1, kv, u P, D): the u prompts' positions one after another."""
    u, heads, P, D = cached.shape
    return cached.transpose(0, 1).reshape(1, heads, u * P, D)


def _packed_mask(prompt_real: Tensor, prompt_of: Tensor, rows: Tensor) -> Tensor:
    """(u, P) bool real prompt tokens, (L,) each packed token's prompt and row -> (L, u P + L)
    bool: a token sees its own prompt's real tokens and its own row's tokens up to itself."""
    u, P = prompt_real.shape
    L = rows.shape[0]
    own_prompt = prompt_of[:, None] == torch.arange(u, device=rows.device)[None]  # (L, u)
    sees_prompt = (own_prompt[:, :, None] & prompt_real[None]).reshape(L, u * P)  # (L, u P)
    order = torch.arange(L, device=rows.device)
    sees_row = (rows[:, None] == rows[None]) & (order[None] <= order[:, None])  # (L, L) causal
    return torch.cat([sees_prompt, sees_row], 1)


def _as_mask(allowed: Tensor, attention: str) -> Tensor:
    """(L, K) bool -> the (1, 1, L, K) mask `attention` takes: booleans for sdpa (True = may
    attend), 0 / the lowest float32 added to the scores for eager."""
    if attention == "sdpa":
        return allowed[None, None]
    lowest = torch.finfo(torch.float32).min
    additive = torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, lowest)
    return additive[None, None]
