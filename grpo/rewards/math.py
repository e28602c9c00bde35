"""Math-answer reward with the `math-verify` package (``pip install grpo[math]``).

The completion's final answer (a ``\\boxed{}`` value, a LaTeX expression or a
plain number) is parsed and compared symbolically with the gold answer, so
``\\frac{1}{2}``, ``0.5`` and ``1/2`` all match each other. A gold answer
written as bare LaTeX, as datasets of competition problems write them
(``\\frac{\\sqrt3}{2}``, ``2\\pi``, ``x^2+1``), is read as if between ``$`` signs,
since math-verify's extraction would find no answer in ``\\frac{\\sqrt3}{2}`` and only
the leading ``2`` of ``2\\pi``; a delimited one, or plain text with a number in it
(``18 dollars``), is read as written.

Time: math-verify bounds parsing and comparison with ``signal.alarm``, which
Python allows in the main thread only; a sampling thread (``run.max_staleness``
>= 1) or any other thread would run without it, and one pathological expression
could hold the run for good. So math-verify's own timeouts stay off and each
answer's whole check (both parses and the comparison) runs under
`grpo.rewards.time_limit`, which stops it in any thread where Python code runs:
an answer still being checked after ``timeout_seconds`` is wrong, as is one that
fails to parse or verify with any other error. A single C-level computation
(sympy evaluating a huge integer power) is not interrupted until it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpo.rewards.parsers import completion_text
from grpo.rewards.time_limit import time_limit

__all__ = ["math_answer_reward", "verify_answer"]


def _import_math_verify() -> Any:
    try:
        import math_verify
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the math reward needs the math-verify package: pip install 'grpo[math]'"
        ) from error
    return math_verify


_DELIMITERS = ("$", "\\boxed", "\\(", "\\[")


def _parse_gold(math_verify: Any, gold: str) -> list:
    """A gold answer parsed: as written when it is delimited (``$``, ``\\boxed``, ``\\(``,
    ``\\[``); as LaTeX math (between ``$`` signs) when it holds a LaTeX command; else as
    written, or as LaTeX math when that finds no answer (``x^2+1``)."""
    def parse(text: str) -> list:
        return math_verify.parse(text, parsing_timeout=None)

    if any(mark in gold for mark in _DELIMITERS):
        return parse(gold)
    if "\\" in gold:
        return parse(f"${gold}$")
    return parse(gold) or parse(f"${gold}$")


def verify_answer(completion: str, gold: str, *, timeout_seconds: float = 5) -> bool:
    """Whether the answer in `completion` equals `gold` mathematically, found within
    `timeout_seconds` (in any thread; False when the check runs out of time)."""
    math_verify = _import_math_verify()
    limit = time_limit(timeout_seconds)
    try:
        with limit:  # math-verify's signal-based timeouts off (None): they need the main thread
            gold_parsed = _parse_gold(math_verify, str(gold))
            answer_parsed = math_verify.parse(completion, parsing_timeout=None)
            if not gold_parsed or not answer_parsed:
                return False
            return bool(math_verify.verify(gold_parsed, answer_parsed, timeout_seconds=None))
    except limit.error:  # a pathological expression: wrong, as math-verify's own timeout scores it
        return False
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
