"""Composable parsers: text -> (action, reward, observation), after picoRL.

A parser takes the current action (at first the raw model text) and returns a
`ParseResult`. `compose_parsers` runs parsers in order: each sees the action
the previous one produced, rewards accumulate, and the first failure
(`action is None`) stops the chain; its observation (for example an error
message to show the model in a multi-turn environment) is returned.

This is the pattern picoRL takes from Ludic's parser composition. Departures:
- the building blocks `tag_parser`, `regex_parser` and `strip_parser` ship with it;
- `parser_reward` turns a parser into a text reward callable
  ``reward(prompts, completions, **columns) -> list[float]`` (the library's
  reward contract), so format checks compose with the other rewards.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = [
    "ParseResult",
    "Parser",
    "completion_text",
    "compose_parsers",
    "parser_reward",
    "regex_parser",
    "strip_parser",
    "tag_parser",
]


class ParseResult(NamedTuple):
    """What a parser made of its input."""

    action: Any  # the parsed action, None when parsing failed
    reward: float = 0.0  # reward (or penalty, when negative) earned by this step
    obs: str | None = None  # feedback for the model, typically set on failure


Parser = Callable[[Any], ParseResult]


def compose_parsers(*parsers: Parser) -> Parser:
    """One parser that runs `parsers` in order, short-circuiting on the first failure."""
    if not parsers:
        raise ValueError("compose_parsers needs at least one parser, got none")
    for index, parser in enumerate(parsers):
        if not callable(parser):
            raise TypeError(f"parsers[{index}] must be callable, got {type(parser).__name__}")

    def composed(raw: Any) -> ParseResult:
        current = ParseResult(action=raw, reward=0.0, obs=None)
        for parser in parsers:
            result = parser(current.action)
            total = current.reward + float(result.reward)
            if result.action is None:
                return ParseResult(action=None, reward=total, obs=result.obs)
            # Observations of successful steps are dropped: only a failure talks back.
            current = ParseResult(action=result.action, reward=total, obs=None)
        return current

    return composed


def strip_parser(text: str) -> ParseResult:
    """Strip surrounding whitespace; fails (reward 0) on an empty result."""
    stripped = str(text).strip()
    if not stripped:
        return ParseResult(None, 0.0, "The answer is empty.")
    return ParseResult(stripped)


def tag_parser(tag: str, *, reward: float = 0.0, penalty: float = 0.0) -> Parser:
    """Extract the content of the last ``<tag>...</tag>``; `reward` if found, else `penalty`."""
    if not re.fullmatch(r"[A-Za-z_][\w\-]*", tag):
        raise ValueError(f"tag must be a plain tag name such as 'answer', got {tag!r}")
    pattern = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)

    def parse(text: str) -> ParseResult:
        found = pattern.findall(str(text))
        if not found:
            return ParseResult(None, penalty, f"Put your answer between <{tag}> and </{tag}>.")
        return ParseResult(found[-1].strip(), reward)

    return parse


def regex_parser(
    pattern: str, *, group: int | str = 0, reward: float = 0.0, penalty: float = 0.0
) -> Parser:
    """Action = `group` of the first match of `pattern` (re.search); `penalty` when absent."""
    compiled = re.compile(pattern, re.DOTALL)

    def parse(text: str) -> ParseResult:
        match = compiled.search(str(text))
        if match is None:
            return ParseResult(None, penalty, f"The answer must match {pattern!r}.")
        return ParseResult(match.group(group), reward)

    return parse


def completion_text(completion: Any, index: int = 0) -> str:
    """The text of a completion: a string, or the content of the last chat message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
    if isinstance(completion, dict) and isinstance(completion.get("content"), str):
        return completion["content"]
    raise TypeError(
        f"completions[{index}] must be a str or a list of chat messages "
        f"({{'role', 'content'}} dicts), got {type(completion).__name__}"
    )


def parser_reward(parser: Parser) -> Callable[..., list[float]]:
    """A text reward callable whose value is the accumulated reward of `parser`."""

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        return [float(parser(completion_text(c, i)).reward) for i, c in enumerate(completions)]

    reward.__name__ = f"parser_reward_{getattr(parser, '__name__', 'parser')}"
    return reward
