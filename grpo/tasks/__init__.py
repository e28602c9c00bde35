"""Built-in tasks: seeded dataset generators, rewards and evaluations (`arithmetic`, `chess`,
`guess_number`, `word_problems`), and the helpers the generators and evaluations share."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Hashable, Sequence

__all__ = ["clustered_standard_error", "draw_distinct", "hash_split"]

_HASH_BUCKETS = 10_000


def hash_split(text: str, held_out_fraction: float, supervised_fraction: float = 0.0) -> str:
    """ "held_out", "supervised" or "train": a stable hash of the text decides, never a seed, so
    no seed can put a held-out item into training. The first `held_out_fraction` of the hash
    range is held out, the next `supervised_fraction` kept for a supervised warm start (so
    that reinforcement learning never trains on what the warm start was taught), the rest is
    "train"."""
    bucket = zlib.crc32(text.encode("utf-8")) % _HASH_BUCKETS
    if bucket < held_out_fraction * _HASH_BUCKETS:
        return "held_out"
    if bucket < (held_out_fraction + supervised_fraction) * _HASH_BUCKETS:
        return "supervised"
    return "train"


def draw_distinct(
    count: int,
    draw: Callable[[], str | None],
    keep: Callable[[str], bool],
    *,
    unique: bool = True,
    shortfall: Callable[[int], str],
) -> list[str]:
    """`count` candidates from `draw()` (None = no candidate) that `keep` accepts, in order.

    With `unique`, repeats are skipped. After 50 draws per item (plus 1000) a
    ValueError with `shortfall(found)` says the space is too small.
    """
    found: list[str] = []
    seen: set[str] = set()
    for _ in range(50 * count + 1000):
        if len(found) == count:
            break
        candidate = draw()
        if candidate is None or (unique and candidate in seen) or not keep(candidate):
            continue
        seen.add(candidate)
        found.append(candidate)
    if len(found) < count:
        raise ValueError(shortfall(len(found)))
    return found


def clustered_standard_error(values: Sequence[float], clusters: Sequence[Hashable]) -> float:
    """Standard error of the mean of `values` when items of one cluster are not independent
    (problems that share an equation, samples of one prompt).

    The cluster-robust variance of a mean (Cameron and Miller, 2015, "A Practitioner's Guide
    to Cluster-Robust Inference", eq. 11 with its small-sample factor C / (C - 1)):

        Var = C / (C - 1) * sum_c (sum_{i in c} (y_i - mean))^2 / n^2

    for n values in C clusters. With one value a cluster it is the usual s / sqrt(n) with s
    the standard deviation over n - 1 (the two agree exactly); with repeats it grows with how
    alike a cluster's values are. NaN with fewer than two clusters (no spread to measure).
    """
    if len(values) != len(clusters):
        raise ValueError(f"values and clusters differ in length: {len(values)} and {len(clusters)}")
    n = len(values)
    sums: dict[Hashable, float] = {}
    mean = math.fsum(values) / n if n else float("nan")
    for value, cluster in zip(values, clusters, strict=True):
        sums[cluster] = sums.get(cluster, 0.0) + (value - mean)
    c = len(sums)
    if c < 2:
        return float("nan")
    return math.sqrt(c / (c - 1) * math.fsum(s * s for s in sums.values())) / n
