"""Built-in tasks: seeded dataset generators, rewards and evaluations (`arithmetic`, `chess`,
`guess_number`, `word_problems`), and the two helpers the generators share."""

from __future__ import annotations

import zlib
from collections.abc import Callable

__all__ = ["draw_distinct", "hash_split"]

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
