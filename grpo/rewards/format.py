"""Format rewards: does a completion have the required shape?

Two families, both text reward callables following the library's contract
``reward(prompts, completions, **columns) -> list[float]``:

- `tag_format_reward(("think", "answer"))`: the completion consists of the tags in
  that order, each exactly once, with only whitespace around them (the
  "reasoning then answer" format of DeepSeek-R1, arXiv:2501.12948);
- `regex_format_reward(pattern)`: the whole completion matches a regular expression.

Both give `reward` when the format holds and `penalty` otherwise. With
``partial=True`` the tag reward instead pays in shares, a denser signal for small
models (a departure from the all-or-nothing R1 check, off by default): of
``len(tags) + 1`` equal shares of ``reward - penalty``, one per tag that appears
exactly once and the last for the whole format holding, so tags in the wrong order
or with text around them earn less than the format itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from grpo.rewards.parsers import completion_text

__all__ = ["regex_format_reward", "tag_format_reward"]

_TAG_NAME = re.compile(r"[A-Za-z_][\w\-]*")


def tag_format_reward(
    tags: Sequence[str] = ("think", "answer"),
    *,
    reward: float = 1.0,
    penalty: float = 0.0,
    partial: bool = False,
) -> Callable[..., list[float]]:
    """Reward completions made of ``<tag>...</tag>`` blocks in the order of `tags`."""
    tags = tuple(tags)
    if not tags:
        raise ValueError("tags must name at least one tag, got an empty sequence")
    for tag in tags:
        if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
            raise ValueError(f"tags must be plain tag names such as 'answer', got {tag!r}")
    blocks = r"\s*".join(rf"<{t}>(?:(?!<{t}>|</{t}>).)*</{t}>" for t in tags)
    whole = re.compile(rf"\s*{blocks}\s*", re.DOTALL)

    def score(text: str) -> float:
        if whole.fullmatch(text):
            return reward
        if not partial:
            return penalty
        once = sum(text.count(f"<{t}>") == 1 and text.count(f"</{t}>") == 1 for t in tags)
        return penalty + (reward - penalty) * once / (len(tags) + 1)  # the last share: whole

    def tag_format(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        return [score(completion_text(c, i)) for i, c in enumerate(completions)]

    return tag_format


def regex_format_reward(
    pattern: str, *, reward: float = 1.0, penalty: float = 0.0, flags: int = re.DOTALL
) -> Callable[..., list[float]]:
    """`reward` where the whole completion matches `pattern` (re.fullmatch), else `penalty`."""
    try:
        compiled = re.compile(pattern, flags)
    except re.error as error:
        raise ValueError(
            f"pattern {pattern!r} is not a valid regular expression: {error}"
        ) from None

    def regex_format(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        return [
            reward if compiled.fullmatch(completion_text(c, i)) else penalty
            for i, c in enumerate(completions)
        ]

    return regex_format
