"""Compute precision of a policy: one name for every policy, its autocast, and a check.

    with compute_precision("bf16-mixed", "cpu"):    # forward (and so backward) in bfloat16
        loss = policy_loss(...)

`PRECISIONS` names what a policy's forward and backward compute in, while
its weights, their gradients and the optimizer state stay float32 (mixed
precision, Micikevicius et al. 2018): `torch.autocast` runs matrix products
in the low dtype from float32 weights and gradients come back in float32.
Everything computed from the model's outputs after it (log-softmax, loss,
advantages, KL) is float32 as without it. bf16-copy (`COPIED`) keeps the same
float32 weights, gradients and optimizer state, but runs the forward and
backward on a bfloat16 copy of the model, re-cast once per optimizer step
(`grpo.lm.compute_copy`), with no autocast: the norms, residual stream and
attention compute in bfloat16 too.

Autocast keeps a cache of each weight's low-precision cast while a forward runs,
so a weight used twice (a prompt's forward shared by its group's completions)
is cast once and its two gradients meet in the low dtype; without the cache each
use casts its own copy and the gradients meet in float32. The cache is
process-wide, and any thread leaving its outermost autocast clears it: with a
sampling thread beside the trainer, the trainer's second use of a weight cast
anew or reused depending on when that thread left, and bf16-mixed runs trained
on other batches from one run to the next (docs/async.md).
`hold_weight_cache_off()` turns the cache off for every `compute_precision` while
such a thread runs, until its `release_weight_cache()`.

`policy.precision: auto` (`resolve_precision`) chooses bf16-mixed where
bfloat16 matrix products are faster than float32 on the model's device (a GPU
with native bfloat16; a CPU measured once a process by `bfloat16_speedup`:
2.3x float32 on a Xeon with AMX, 0.14x on an AMD EPYC with AVX2 alone, where
they are emulated) and fp32 elsewhere; an explicit bf16-mixed where they are
slower is kept, with one warning naming the field.

`update_stall_share` estimates, for weights *stored* in bfloat16 or float16,
the share whose value an optimizer step of size `lr` cannot change: a step
rounds away when it is below half the spacing of the dtype's numbers near
the weight (an Adam(W) step moves each weight by about `lr`).
`warn_if_updates_stall` turns that into one warning naming the key to use.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "AUTO",
    "AUTOCAST_TWIN",
    "COPIED",
    "PRECISIONS",
    "PRECISION_ALIASES",
    "bfloat16_fast",
    "bfloat16_speedup",
    "cast_once",
    "check_precision",
    "compute_dtype",
    "compute_precision",
    "hold_weight_cache_off",
    "release_weight_cache",
    "resolve_precision",
    "trained_and_peak_lr",
    "update_stall_share",
    "warn_if_updates_stall",
]

PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None,  # everything in the weights' own dtype
    "bf16-mixed": torch.bfloat16,  # float32 weights, bfloat16 matrix products (autocast)
    "fp16-mixed": torch.float16,  # as bf16-mixed; needs a gradient scaler against underflow
    "bf16-copy": torch.bfloat16,  # float32 masters; forward and backward on a bfloat16 copy
}
"""precision name -> the dtype matrix products run in (None = the weights' own)."""

COPIED: frozenset[str] = frozenset({"bf16-copy"})
"""Precisions computed on a copy of the model in their dtype (`grpo.lm.compute_copy`), with no
autocast: the model a forward runs is the copy, not the float32 one."""

AUTOCAST_TWIN: dict[str, str] = {"bf16-copy": "bf16-mixed"}
"""A `COPIED` precision -> the autocast one with the same dtype: what code running the float32
model itself in that precision computes under (the lean engine's own bfloat16 copy)."""

PRECISION_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "bf16": "bf16-mixed",
    "bfloat16": "bf16-mixed",
    "fp16": "fp16-mixed",
    "float16": "fp16-mixed",
}
"""Older spellings still accepted (the fill-in policy's `autocast_dtype`, the fill-in
example's `precision`), mapped to their `PRECISIONS` name."""

AUTO = "auto"
"""The precision resolved when the model's device is known (`resolve_precision`)."""

_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}  # stored fraction bits
log = logging.getLogger(__name__)


def check_precision(field: str, value: Any, *, auto: bool = False, copy: bool = True) -> str:
    """`value` as a `PRECISIONS` name (aliases mapped), or `AUTO` where `auto` allows it, and a
    `COPIED` one only where `copy` allows it (a causal-LM policy); raises naming `field`
    otherwise."""
    name = PRECISION_ALIASES.get(value, value) if isinstance(value, str) else value
    if auto and name == AUTO:
        return AUTO
    if name not in PRECISIONS or (name in COPIED and not copy):
        names = [p for p in PRECISIONS if copy or p not in COPIED]
        allowed = ", ".join([*names, *PRECISION_ALIASES, *([AUTO] if auto else [])])
        raise ValueError(f"{field}: got {value!r}; allowed: {allowed}")
    return name


@functools.cache
def bfloat16_speedup() -> float:
    """float32's time over bfloat16's for one (256, 1024) @ (1024, 1024) matrix product on
    this CPU with torch's threads, the best of 3 after a warm-up, measured once a process
    (about 0.1 s): above 1, bfloat16 is the faster. The matrices come from a generator of
    its own: a run seeded before its policy resolves `auto` draws the same numbers after."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(256, 1024, generator=generator)  # (256, 1024)
    b = torch.randn(1024, 1024, generator=generator)  # (1024, 1024)

    def best(x: Tensor, y: Tensor) -> float:
        x @ y  # warm-up: kernels chosen, memory touched
        times = []
        for _ in range(3):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        return min(times)

    return best(a, b) / best(a.bfloat16(), b.bfloat16())


def bfloat16_fast(device: torch.device | str) -> tuple[bool | None, str]:
    """(whether bfloat16 matrix products beat float32 on `device`, why): a CUDA GPU by its
    native bfloat16 support, a CPU by `bfloat16_speedup`; None where there is no check."""
    device = torch.device(device)
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        name = torch.cuda.get_device_name(device)
        return native, f"{name} has {'' if native else 'no '}native bfloat16"
    if device.type == "cpu":
        speed = bfloat16_speedup()
        return speed > 1.0, f"bfloat16 matrix products run at {speed:.2f}x float32's speed here"
    return None, f"no bfloat16 check for {device.type} devices"


def resolve_precision(field: str, precision: str, device: torch.device | str) -> str:
    """`precision` (a `PRECISIONS` name or `AUTO`) for a model on `device`: auto -> bf16-mixed
    where `bfloat16_fast`, else fp32 (said in the log, logger "grpo.precision"); bf16-mixed
    or bf16-copy where bfloat16 is slower stays, with one warning naming `field`; anything
    else as it is."""
    if precision != AUTO and PRECISIONS[precision] is not torch.bfloat16:
        return precision
    fast, why = bfloat16_fast(device)
    if precision == AUTO:
        chosen = "bf16-mixed" if fast else "fp32"
        log.info("%s: auto -> %s (%s)", field, chosen, why)
        return chosen
    if fast is False:
        warnings.warn(
            f"{field}: {precision}, but {why}: fp32 (or auto) computes faster on this device",
            stacklevel=3,
        )
    return precision


_cache_off_holds = 0  # sampling threads running now: autocast's weight cache is off while any
_cache_lock = threading.Lock()


def hold_weight_cache_off() -> None:
    """One more user (a sampling thread, from its start) needs autocast's weight-cast cache
    off for `compute_precision` in every thread (see above)."""
    global _cache_off_holds
    with _cache_lock:
        _cache_off_holds += 1


def release_weight_cache(everything: bool = False) -> None:
    """One user fewer (at its close), or none (`everything`: a forked process, where the
    holders are not); the cache is on again once no one holds it off."""
    global _cache_off_holds
    with _cache_lock:
        _cache_off_holds = 0 if everything else max(_cache_off_holds - 1, 0)


def compute_precision(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """The context a forward (and the backward of what it builds) runs under:
    `torch.autocast` to the precision's dtype, or nothing for fp32 and for a precision
    computed on a copy (`COPIED`: the copy is already in its dtype)."""
    dtype = PRECISIONS[precision]
    if dtype is None or precision in COPIED:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype, cache_enabled=_cache_off_holds == 0)


# weight -> (its version counter when cast, the cast), keyed by identity; a cast lives as
# long as its weight
_CASTS = WeakIdKeyDictionary()


def cast_once(weight: Tensor, dtype: torch.dtype) -> Tensor:
    """`weight` in `dtype` (detached), cast again only once the weight has changed in place
    since (an optimizer step, a loaded checkpoint: its version counter moved) or moved to
    another device, or `weight` itself when it is already in `dtype`. For a weight that
    several passes read between two updates, as the folded output layer's is by every
    micro-batch of a step and, frozen, by every step: one cast where each pass would make its
    own. Holds one cast per weight (a bfloat16 copy of Gemma 3's 262,144 x 640 output layer is
    320 MiB). A write the version counter does not see (through `.data`, or a fused
    optimizer's: the trainer moves the counters after each step) is not seen here either."""
    if weight.dtype == dtype:
        return weight
    version = weight._version
    held = _CASTS.get(weight)
    if held is not None and held[0] == version and held[1].dtype == dtype and (
        held[1].device == weight.device
    ):
        return held[1]
    cast = weight.detach().to(dtype)
    _CASTS[weight] = (version, cast)
    return cast


def compute_dtype(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype matrix products of `dtype` tensors run in here: autocast's dtype while
    autocast is on for `device_type`, else `dtype`. The folded output layer multiplies in
    it (`grpo.lm.scoring`); tolerances set by rounding read it too."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


def update_stall_share(params: Iterable[Tensor], lr: float) -> tuple[float, int]:
    """(share of elements whose update of size `lr` rounds away, elements counted) over the
    bfloat16 / float16 tensors of `params`: |Δw| = lr < ulp(w) / 2 (round to nearest).

    ulp(w) = 2^(e - 1 - bits) for |w| = m · 2^e, m in [0.5, 1): the spacing of the dtype's
    numbers at w's binade (at an exact power of two, a step towards zero sees half of it).
    Zeros count as changeable (their spacing is the smallest)."""
    stalled, total = 0, 0
    for p in params:
        bits = _MANTISSA_BITS.get(p.dtype)
        if bits is None:
            continue
        w = p.detach().float().abs()
        _, exponent = torch.frexp(w)
        half_ulp = torch.ldexp(torch.ones_like(w), exponent - 2 - bits)  # ulp(w) / 2
        stalled += int(((half_ulp > lr) & (w > 0)).sum())
        total += w.numel()
    return (stalled / total if total else 0.0), total


def warn_if_updates_stall(params: Iterable[Tensor], lr: float, threshold: float = 0.5) -> float:
    """Warn (once per call site, `warnings.warn`) when more than `threshold` of the trainable
    low-precision weights cannot move by a step of `lr`; returns the share."""
    share, total = update_stall_share(params, lr)
    if total and share > threshold:
        warnings.warn(
            f"{share:.1%} of the {total:,} trainable bfloat16/float16 weights sit where that "
            f"dtype's numbers are more than 2 * lr = {2 * lr:.3g} apart, so an update of about "
            "lr (an Adam step) rounds away and leaves them unchanged: training "
            "stalls silently. Keep the weights in float32 (model.dtype: float32) and compute "
            "in bfloat16 with policy.precision: bf16-mixed instead.",
            stacklevel=3,
        )
    return share


def trained_and_peak_lr(optimizer: Any) -> tuple[list[Tensor], float]:
    """The optimizer's trainable tensors and its largest (peak, before any schedule) rate."""
    groups = getattr(optimizer, "param_groups", [])
    params = [p for g in groups for p in g["params"] if p.requires_grad]
    rates = [float(g.get("initial_lr", g.get("lr", 0.0))) for g in groups]
    return params, max(rates, default=0.0)
