"""Completion rows for the scoring tests: groups behind shared prompts, ragged and shuffled."""

from __future__ import annotations

import random
from collections.abc import Callable

from grpo.lm.completion import Completion

__all__ = ["grouped_completions"]


def grouped_completions(
    vocab: int, eos: int, group_size: int, length: Callable[[int, int], int], seed: int = 0
) -> list[Completion]:
    """Groups of `group_size` rows behind prompts of 4, 9, 1 and 6 tokens, row j of prompt p
    with `length(p, j)` tokens (the second row of every other group cut by an EOS after two
    and followed by two more), and one row with a prompt of its own; shuffled, so a prompt's
    rows are not contiguous."""
    rng = random.Random(seed)
    words = [t for t in range(3, vocab) if t != eos]
    prompts = [rng.choices(words, k=k) for k in (4, 9, 1, 6)]
    out = []
    for p, prompt in enumerate(prompts):
        for j in range(group_size):
            ids = rng.choices(words, k=length(p, j))
            if j == 1 and p % 2:
                ids = [*ids[:2], eos, *rng.choices(words, k=2)]
            out.append(Completion("x", ids, prompt, truncated=False, finished_by_eos=eos in ids))
    out.append(Completion("x", rng.choices(words, k=5), rng.choices(words, k=7), False, False))
    rng.shuffle(out)
    return out
