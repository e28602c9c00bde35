"""Choosing the next token from a row of logits: greedy, or sampled with temperature, top-k, top-p.

Pure functions used by the lean decoding loop (`grpo.lm.engines.lean`) and the masked
fill-in policy (`grpo.masked_fill`); they
apply the same warpers, in the same order, as transformers' `generate` with the
settings `GenerationSettings` passes it: temperature, then top-k, then top-p
(nucleus sampling, Holtzman et al. 2020: keep the smallest set of most likely
tokens whose probability reaches p).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["choose_tokens", "draw_indices", "filter_logits", "sampled_logprobs"]

DRAW_BLOCK = 256  # entries per block in draw_indices' first stage


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set to -inf every token outside the top k and outside the top-p nucleus -> (n, V).

    logits: (n, V) already divided by the temperature. top_k = 0 keeps all; ties
    with the k-th value are kept. top_p = 1 keeps all; the most likely token is
    always kept.
    """
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (n, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1)  # (n, V) least likely first
        mass_below = ascending.softmax(-1).cumsum(-1)  # (n, V) mass of this token and all below
        drop = mass_below <= 1.0 - top_p  # (n, V) the rest still holds at least top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def choose_tokens(
    logits: Tensor, do_sample: bool, temperature: float, top_k: int, top_p: float
) -> Tensor:
    """Next token of each row: logits (n, V) -> ids (n,). Sampling draws from the global RNG."""
    logits = logits.float()
    if not do_sample:
        return logits.argmax(-1)  # (n,)
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)  # (n, V)
    return draw_indices(probs)  # (n,)


def draw_indices(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One index per row, index v with probability probs[v] / sum(probs): (n, V) -> (n,).

    Inverse-CDF sampling in two stages, each one uniform located among running sums in
    float64: first a block of `DRAW_BLOCK` entries by the blocks' masses, then an entry
    within the block. Every probability keeps its relative precision (a float32 running sum
    over the whole row would round small ones to multiples of 6e-8), and an entry of
    probability 0 owns an empty interval and is never drawn. `torch.multinomial` gives the
    same distribution but draws one exponential per entry: at n = 32, V = 49152 it took 44-60 ms
    on 2 CPU cores, once per generated token (bench/token_draw.py, docs/performance.md).
    A row whose sum is not finite and positive (nan, inf, all zero) raises ValueError.
    """
    n, V = probs.shape
    if V % DRAW_BLOCK:  # zeros to a whole block; F.pad would copy the row even to add none
        probs = F.pad(probs, (0, -V % DRAW_BLOCK))  # (n, K * block)
    blocks = probs.reshape(n, -1, DRAW_BLOCK)  # (n, K, block)
    masses = blocks.sum(-1, dtype=torch.float64)  # (n, K)
    totals = masses.sum(-1)  # (n,)
    drawable = torch.isfinite(totals) & (totals > 0)  # (n,)
    if not bool(drawable.all()):
        bad = int((~drawable).nonzero()[0])
        raise ValueError(
            f"draw_indices: row {bad} sums to {float(totals[bad])}; allowed: finite > 0"
        )
    block = _locate(masses, generator)  # (n,)
    rows = torch.arange(n, device=probs.device)
    within = _locate(blocks[rows, block].double(), generator)  # (n,)
    return block * DRAW_BLOCK + within  # (n,)


def _locate(weights: Tensor, generator: torch.Generator | None) -> Tensor:
    """Index k with probability weights[k] / sum(weights), float64 (n, K) -> (n,)."""
    running = weights.cumsum(-1)  # (n, K)
    total = running[:, -1:]  # (n, 1)
    u = torch.rand(total.shape, dtype=total.dtype, device=total.device, generator=generator)
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # < total
    return torch.searchsorted(running, point, right=True).squeeze(-1)  # (n,)


def sampled_logprobs(
    logits: Tensor, tokens: Tensor, temperature: float, top_k: int, top_p: float
) -> Tensor:
    """log q(token) under the distribution `choose_tokens` samples from: the tempered softmax
    renormalised over the top-k / top-p set. logits (n, V), tokens (n,) -> (n,).

    With truncation q = p / Z on the kept set (Z its mass under the tempered p), so the
    trainer's untruncated log p minus this is log Z <= 0 (`grpo.functional.importance`).
    """
    kept = filter_logits(logits.float() / temperature, top_k, top_p)  # (n, V)
    return kept.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)  # (n,)
