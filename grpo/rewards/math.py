"""Math-answer reward with the `math-verify` package (``pip install grpo[math]``).

The completion's final answer (a ``\\boxed{}`` value, a LaTeX expression or a
plain number) is parsed and compared symbolically with the gold answer, so
``\\frac{1}{2}``, ``0.5`` and ``1/2`` all match each other.

Threads: math-verify bounds parsing and comparison time with ``signal.alarm``,
which Python only allows in the main thread; called from any other thread
(a data-loader worker, a thread pool of reward calls) it raises. This module
passes the timeouts only when running in the main thread and disables them
elsewhere, so the reward works everywhere; the price is that a pathological
expression parsed outside the main thread is not interrupted. Any error while
parsing or verifying scores the completion as wrong rather than raising.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from grpo.rewards.parsers import completion_text

__all__ = ["in_main_thread", "math_answer_reward", "verify_answer"]


def in_main_thread() -> bool:
    """True when signal-based timeouts (``signal.alarm``) are allowed here."""
    return threading.current_thread() is threading.main_thread()


def _import_math_verify() -> Any:
    try:
        import math_verify
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the math reward needs the math-verify package: pip install 'grpo[math]'"
        ) from error
    return math_verify


def verify_answer(completion: str, gold: str, *, timeout_seconds: int = 5) -> bool:
    """Whether the answer in `completion` equals `gold` mathematically."""
    math_verify = _import_math_verify()
    # signal.alarm is only legal in the main thread: elsewhere run without it.
    timeout = timeout_seconds if in_main_thread() else None
    try:
        gold_parsed = math_verify.parse(str(gold), parsing_timeout=timeout)
        answer_parsed = math_verify.parse(completion, parsing_timeout=timeout)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(math_verify.verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - an unparseable answer is a wrong answer, not a crash
        return False


def math_answer_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Sequence[Any],
    **_: Any,
) -> list[float | None]:
    """1.0 where the completion's answer equals the `answer` column, 0.0 if not, None if no gold."""
    if len(completions) != len(answer):
        raise ValueError(
            f"completions and answer must have the same length, got "
            f"{len(completions)} and {len(answer)}"
        )
    scores: list[float | None] = []
    for index, (completion, gold) in enumerate(zip(completions, answer, strict=True)):
        if gold is None:
            scores.append(None)  # rows without a gold answer are not math rows
            continue
        text = completion_text(completion, index)
        scores.append(1.0 if verify_answer(text, str(gold)) else 0.0)
    return scores
