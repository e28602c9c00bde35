"""Per-token policy-gradient losses and the denominators that aggregate them.

A loss is two choices, each a small function in a table:

`POLICY_LOSSES`, the per-token loss (minimisation form, A = advantage, r = ratio):
- "reinforce": -A · log π (picoRL: on-policy, no ratio, no clip). Its gradient
  equals the clipped loss's at r = 1 (old_logprobs = logprobs.detach()).
- "clipped": -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A), r = π/π_old (PPO; the framework API;
  decoupled ε_low/ε_high from DAPO, Yu et al. 2025).
- "gspo": the clipped form with the sequence ratio s = exp(mean_t(log π - log π_old))
  on every token of the sequence (GSPO, Zheng et al. 2025, their token-level
  form s_t = sg[s]·π_t/sg[π_t]: value s, gradient s·∇log π_t).
- "cispo": -sg(clip(r, 1-ε_low, 1+ε_high))·A·log π (CISPO, MiniMax-M1 2025):
  the importance weight is clipped and detached, so clipped tokens still get
  a gradient. As in the paper there is no lower bound unless `cispo_clip_low`.

`AGGREGATIONS`, how the masked (N, T) per-token values become one number:
- "sequence_mean": mean_i [ Σ_t ℓ_it / |o_i| ]  (GRPO, Shao et al. 2024; the chess loop)
- "token_mean":    Σ_it ℓ_it / Σ_i |o_i|          (BNPO; DAPO)
- "constant_length": Σ_it ℓ_it / (N · L_max)      (Dr. GRPO, Liu et al. 2025)
- "sequence_sum":  mean_i [ Σ_t ℓ_it ]             (the fill-in plan and picoRL)

Optional `importance_weights` (N, T) multiply the per-token policy loss before
aggregation, as constants: truncated importance sampling for a sampler that is
not the trainer (`grpo.functional.importance`; Yao et al. 2025). The KL and
entropy terms are not weighted.

Departures: padded positions are replaced with zeros by `torch.where` before
any arithmetic, so NaN or inf there cannot leak into the loss or a gradient;
a sequence with no counted tokens contributes 0 (its denominator is clamped to
1); old and reference log-probs and advantages are treated as constants.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from grpo.functional._checks import check_positive, check_shape, check_tensor, lookup
from grpo.functional.kl import KL_ESTIMATORS, kl_estimate

__all__ = [
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "Clip",
    "GlobalCounts",
    "TokenLoss",
    "aggregate",
    "policy_loss",
]


class Clip(NamedTuple):
    """Bounds on the importance ratio: [low, high]; low None = no lower bound."""

    low: float | None
    high: float


class TokenLoss(NamedTuple):
    """What a per-token loss returns; every tensor is (N, T)."""

    loss: Tensor  # per-token loss, differentiable
    ratio: Tensor  # the importance ratio the loss used (detached)
    clipped_low: Tensor  # bool: ratio below its lower bound and clipped
    clipped_high: Tensor  # bool: ratio above its upper bound and clipped


# Each loss takes logprobs, old_logprobs (N, T), zero at padding; advantages (N, 1);
# completion_mask (N, T) bool; and the ratio bounds.
TokenLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Clip], TokenLoss]


def _surrogate(ratio: Tensor, advantages: Tensor, clip: Clip) -> TokenLoss:
    """PPO's pessimistic bound -min(r·A, clip(r)·A): zero gradient once clipped."""
    clipped = ratio.clamp(clip.low, clip.high)  # (N, T)
    loss = -torch.min(ratio * advantages, clipped * advantages)  # (N, T)
    # the clip only binds on the side the advantage pushes towards
    if clip.low is None:
        low = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        low = (ratio < clip.low) & (advantages < 0)
    high = (ratio > clip.high) & (advantages > 0)
    return TokenLoss(loss, ratio.detach(), low, high)


def _reinforce(logprobs, old_logprobs, advantages, completion_mask, clip) -> TokenLoss:
    ratio = torch.exp(logprobs - old_logprobs).detach()  # (N, T) for logging only
    never = torch.zeros_like(completion_mask)
    return TokenLoss(-advantages * logprobs, ratio, never, never)


def _clipped(logprobs, old_logprobs, advantages, completion_mask, clip) -> TokenLoss:
    return _surrogate(torch.exp(logprobs - old_logprobs), advantages, clip)


def _gspo(logprobs, old_logprobs, advantages, completion_mask, clip) -> TokenLoss:
    counts = completion_mask.sum(dim=1, keepdim=True).clamp(min=1)  # (N, 1)
    # padding is zero in both inputs, so a plain sum over T is the masked sum
    seq_log_ratio = (logprobs - old_logprobs).sum(dim=1, keepdim=True) / counts  # (N, 1)
    # value: the sequence log-ratio on every token; gradient: that of log π_t alone
    token_log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()  # (N, T)
    return _surrogate(torch.exp(token_log_ratio), advantages, clip)


def _cispo(logprobs, old_logprobs, advantages, completion_mask, clip) -> TokenLoss:
    ratio = torch.exp(logprobs - old_logprobs).detach()  # (N, T)
    weight = ratio.clamp(clip.low, clip.high)  # detached: a weight, not a path for gradient
    low = ratio < clip.low if clip.low is not None else torch.zeros_like(completion_mask)
    return TokenLoss(-weight * advantages * logprobs, ratio, low, ratio > clip.high)


POLICY_LOSSES: dict[str, TokenLossFn] = {
    "reinforce": _reinforce,
    "clipped": _clipped,
    "gspo": _gspo,
    "cispo": _cispo,
}
"""name -> fn(logprobs, old_logprobs, advantages (N, 1), completion_mask, clip) -> TokenLoss."""


def _sequence_mean(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    counts = completion_mask.sum(dim=1).clamp(min=1)  # (N,) |o_i|, 1 for empty sequences
    return (values.sum(dim=1) / counts).mean()


def _token_mean(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    return values.sum() / completion_mask.sum().clamp(min=1)  # Σ|o_i| counted tokens


def _constant_length(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    return values.sum() / (values.shape[0] * max_length)  # N · L_max, independent of lengths


def _sequence_sum(values: Tensor, completion_mask: Tensor, max_length: int) -> Tensor:
    return values.sum(dim=1).mean()


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "sequence_mean": _sequence_mean,
    "token_mean": _token_mean,
    "constant_length": _constant_length,
    "sequence_sum": _sequence_sum,
}
"""name -> fn(values (N, T) zero at padding, completion_mask, max_completion_length) -> ()."""


class GlobalCounts(NamedTuple):
    """Sizes of a batch that is split across processes, counted over every part."""

    num_sequences: int  # N of the whole batch
    num_tokens: int  # Σ_i |o_i| of the whole batch


# The same denominators as AGGREGATIONS, taken from GlobalCounts: each process
# returns its own share of the numerator over the whole batch's denominator, so
# the shares sum (across processes) to the aggregation of the whole batch.
def _sequence_mean_share(values: Tensor, completion_mask: Tensor, max_length, counts) -> Tensor:
    lengths = completion_mask.sum(dim=1).clamp(min=1)  # (n,) |o_i|
    return (values.sum(dim=1) / lengths).sum() / counts.num_sequences


def _token_mean_share(values: Tensor, completion_mask: Tensor, max_length, counts) -> Tensor:
    return values.sum() / max(counts.num_tokens, 1)


def _constant_length_share(values: Tensor, completion_mask: Tensor, max_length, counts) -> Tensor:
    return values.sum() / (counts.num_sequences * max_length)


def _sequence_sum_share(values: Tensor, completion_mask: Tensor, max_length, counts) -> Tensor:
    return values.sum() / counts.num_sequences


_SHARES: dict[str, Callable[[Tensor, Tensor, int, GlobalCounts], Tensor]] = {
    "sequence_mean": _sequence_mean_share,
    "token_mean": _token_mean_share,
    "constant_length": _constant_length_share,
    "sequence_sum": _sequence_sum_share,
}


def _masked(values: Tensor, completion_mask: Tensor) -> Tensor:
    # where, not multiplication: 0 * inf and 0 * NaN are NaN, and so are their gradients
    return torch.where(completion_mask, values, torch.zeros_like(values))


def _masked_mean(values: Tensor, completion_mask: Tensor) -> Tensor:
    return _masked(values, completion_mask).sum() / completion_mask.sum().clamp(min=1)


def aggregate(
    values: Tensor,
    completion_mask: Tensor,
    aggregation: str = "sequence_mean",
    max_completion_length: int | None = None,
    global_counts: GlobalCounts | None = None,
) -> Tensor:
    """One number from per-token values (N, T) with the named denominator; padding ignored.

    `global_counts` given: these N rows are one part of a larger batch; returns
    this part's share, whose sum over all parts is the whole batch's value.
    """
    fn = lookup(AGGREGATIONS, aggregation, "aggregation")
    check_tensor(values, "values")
    check_shape(completion_mask, "completion_mask", tuple(values.shape), "values")
    if completion_mask.dtype != torch.bool:
        raise TypeError(f"completion_mask: got dtype {completion_mask.dtype}; allowed: torch.bool")
    length = values.shape[-1] if max_completion_length is None else max_completion_length
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"max_completion_length: got {length!r}; allowed: None or an int >= 1")
    if global_counts is not None:
        share = _SHARES[aggregation]
        return share(_masked(values, completion_mask), completion_mask, length, global_counts)
    return fn(_masked(values, completion_mask), completion_mask, length)


def _check_inputs(
    logprobs, old_logprobs, advantages, completion_mask, ref_logprobs, entropy, importance_weights
):
    check_tensor(logprobs, "logprobs")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs: got shape {tuple(logprobs.shape)}; allowed: (N, T)")
    shape = tuple(logprobs.shape)
    check_shape(completion_mask, "completion_mask", shape, "logprobs")
    if completion_mask.dtype != torch.bool:
        raise TypeError(
            f"completion_mask: got dtype {completion_mask.dtype}; allowed: torch.bool "
            "(True = counted; convert with .bool())"
        )
    check_shape(advantages, "advantages", shape[:1], "logprobs (N, T) -> (N,)")
    for name, value in (
        ("old_logprobs", old_logprobs),
        ("ref_logprobs", ref_logprobs),
        ("entropy", entropy),
        ("importance_weights", importance_weights),
    ):
        if value is not None:
            check_shape(value, name, shape, "logprobs")


def _check_options(loss_type, aggregation, kl_estimator, eps_low, eps_high, cispo_clip_low):
    """The per-token loss and its ratio bounds, after checking every name and epsilon."""
    loss_fn = lookup(POLICY_LOSSES, loss_type, "loss_type")
    lookup(AGGREGATIONS, aggregation, "aggregation")
    lookup(KL_ESTIMATORS, kl_estimator, "kl_estimator")
    eps_low = check_positive(eps_low, "eps_low", allow_zero=True)
    if eps_high is None:
        eps_high = eps_low
    eps_high = check_positive(eps_high, "eps_high", allow_zero=True)
    if cispo_clip_low and loss_type != "cispo":
        raise ValueError(f"cispo_clip_low: got True with loss_type={loss_type!r}; allowed: 'cispo'")
    # CISPO (MiniMax-M1) bounds its importance weight from above only, unless asked
    unbounded_below = loss_type == "cispo" and not cispo_clip_low
    return loss_fn, Clip(None if unbounded_below else 1.0 - eps_low, 1.0 + eps_high)


def _check_terms(beta, kl_estimator, ref_logprobs, entropy_coeff, entropy):
    """Checked (beta, entropy_coeff); warns when k1 would enter the loss."""
    beta = check_positive(beta, "beta", allow_zero=True)
    entropy_coeff = check_positive(entropy_coeff, "entropy_coeff", allow_zero=True)
    if beta > 0 and ref_logprobs is None:
        raise ValueError(f"ref_logprobs: got None with beta={beta}; allowed: (N, T) log-probs")
    if entropy_coeff > 0 and entropy is None:
        raise ValueError(f"entropy: got None with entropy_coeff={entropy_coeff}; allowed: (N, T)")
    if beta > 0 and kl_estimator == "k1":
        warnings.warn(
            "kl_estimator='k1' in the loss has zero expected gradient, so it does not pull the "
            "policy towards the reference. Use 'k3' or 'k2', or subtract beta * k1 from the "
            "reward instead (a reward-side KL penalty).",
            UserWarning,
            stacklevel=3,
        )
    return beta, entropy_coeff


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    loss_type: str = "clipped",
    aggregation: str = "sequence_mean",
    eps_low: float = 0.2,
    eps_high: float | None = None,
    ref_logprobs: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    entropy: Tensor | None = None,
    entropy_coeff: float = 0.0,
    max_completion_length: int | None = None,
    cispo_clip_low: bool = False,
    global_counts: GlobalCounts | None = None,
    importance_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Policy loss + β·KL - entropy_coeff·entropy, each aggregated the same way.

    logprobs, old_logprobs, ref_logprobs, entropy (N, T); advantages (N,);
    completion_mask (N, T) bool. `old_logprobs` None means on-policy
    (logprobs.detach(), ratio 1). `eps_high` None means `eps_low`;
    `max_completion_length` None means T (used by "constant_length" only);
    `cispo_clip_low` also bounds CISPO's weight below at 1 - eps_low.
    `global_counts` (data-parallel training): these rows are one process's part of
    a batch of that many sequences and tokens; the loss terms are this part's
    shares (see `aggregate`), the statistics stay means over these rows.
    `importance_weights` (N, T), detached, multiply the per-token policy loss
    (None = all 1).
    Returns (loss (), stats): detached 0-dim tensors "loss/policy", "loss/kl",
    "loss/entropy" (they sum to the loss), "ratio/mean", "clip/low_frac",
    "clip/high_frac" (means over counted tokens), "kl/mean" (when ref_logprobs
    is given: the chosen estimator, mean over counted tokens) and
    "entropy/mean" (when entropy is given) and "importance_weight/mean" (when
    importance_weights are given).
    """
    _check_inputs(
        logprobs,
        old_logprobs,
        advantages,
        completion_mask,
        ref_logprobs,
        entropy,
        importance_weights,
    )
    loss_fn, clip = _check_options(
        loss_type, aggregation, kl_estimator, eps_low, eps_high, cispo_clip_low
    )
    beta, entropy_coeff = _check_terms(beta, kl_estimator, ref_logprobs, entropy_coeff, entropy)
    mask = completion_mask

    def total(values: Tensor) -> Tensor:  # the chosen denominator, padding ignored
        return aggregate(values, mask, aggregation, max_completion_length, global_counts)

    # padding is zeroed before any arithmetic so NaN/inf there can reach nothing
    logprobs = _masked(logprobs, mask)  # (N, T)
    old = logprobs.detach() if old_logprobs is None else _masked(old_logprobs.detach(), mask)
    token = loss_fn(logprobs, old, advantages.detach()[:, None], mask, clip)  # (N, T) each

    token_loss = token.loss  # (N, T)
    if importance_weights is not None:  # constants: a weight, never a path for gradient
        token_loss = token_loss * _masked(importance_weights.detach(), mask)

    policy_term = total(token_loss)
    stats = {
        "ratio/mean": _masked_mean(token.ratio, mask),
        "clip/low_frac": _masked_mean(token.clipped_low.to(logprobs.dtype), mask),
        "clip/high_frac": _masked_mean(token.clipped_high.to(logprobs.dtype), mask),
    }
    if importance_weights is not None:
        stats["importance_weight/mean"] = _masked_mean(importance_weights.detach(), mask)
    kl_term, entropy_term = _regularizers(
        logprobs, mask, total, stats, ref_logprobs, beta, kl_estimator, entropy, entropy_coeff
    )
    stats.update({"loss/policy": policy_term, "loss/kl": kl_term, "loss/entropy": entropy_term})
    loss = policy_term + kl_term + entropy_term
    return loss, {key: value.detach() for key, value in stats.items()}


def _regularizers(
    logprobs: Tensor,
    mask: Tensor,
    total: Callable[[Tensor], Tensor],
    stats: dict[str, Tensor],
    ref_logprobs: Tensor | None,
    beta: float,
    kl_estimator: str,
    entropy: Tensor | None,
    entropy_coeff: float,
) -> tuple[Tensor, Tensor]:
    """(β·KL term, -entropy_coeff·entropy term), each aggregated by `total`; adds their
    means over counted tokens to `stats` whenever the inputs are given."""
    zero = logprobs.new_zeros(())
    kl_term = entropy_term = zero
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, _masked(ref_logprobs.detach(), mask), kl_estimator)  # (N, T)
        stats["kl/mean"] = _masked_mean(kl, mask)
        kl_term = beta * total(kl) if beta > 0 else zero
    if entropy is not None:
        entropy = _masked(entropy, mask)  # (N, T)
        stats["entropy/mean"] = _masked_mean(entropy, mask)
        entropy_term = -entropy_coeff * total(entropy) if entropy_coeff > 0 else zero
    return kl_term, entropy_term
