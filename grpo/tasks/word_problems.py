"""Built-in word-problem task: seeded grade-school stories, held out three ways, checked by value.

A problem is a short story about one person's collection: a starting count, one to three
operations (+ buys or is given, - gives away or loses, x "n times as many", / "keeps one of n
equal groups"), then a question for the final count; every value is a positive integer. Each
sentence kind has several phrasings (`TEMPLATES`); the last of every kind is held out
(`HELD_OUT_TEMPLATES`). The prompt is chat messages (an instruction, one worked example, the
problem), read through the model's chat template, or for a base model the same as plain text
(`prompt_form`, `grpo.lm.prompt_forms`). Training prompts may instead be drawn from several
forms (`train_forms`: the scaffold, the instruction alone, the bare problem); the text and
the forms are in `grpo.tasks.word_problem_prompts`.

Splits (`SPLITS`): "train"; "heldout_numbers", training phrasings over held-out equations (an
equation is the start value and the operations, chosen by hash, so its numbers never reach
training); "heldout_phrasings", held-out equations in held-out phrasings; "heldout_bare", the
same asked as a bare question (no instruction, no example, no "Answer: N" request). The gaps
between them are the phrasing alone, then the scaffold alone. Few distinct one-operation
equations exist (about 35 held out at the default sizes), so `breakdown` reports each split's
number of distinct equations and a standard error clustered by equation
(`grpo.tasks.clustered_standard_error`).

The rewards (`correct`, `correct_strict`, `answer_format`, `math_verified`) follow the
library's contract and read the ``answer`` column; the format alone cannot raise `correct`.
They are the same for every prompt form (`answer_format` says why).
Importing this module pulls in nothing heavier than the standard library.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo.lm.prompt_forms import PROMPT_FORMS, in_form
from grpo.tasks import clustered_standard_error, draw_distinct, hash_split
from grpo.tasks.word_problem_prompts import (
    DEFAULT_TRAIN_FORMS,
    EXAMPLE_PROBLEM,
    EXAMPLE_SOLUTION,
    FORMS,
    HELD_OUT_FORMS,
    HELD_OUT_TEMPLATES,
    INSTRUCTION,
    NAMES,
    OBJECTS,
    TEMPLATES,
    WORKED_EXAMPLES,
    check_train_forms,
    check_worked_example,
    draw_forms,
    messages,
)  # fmt: skip

__all__ = [
    "ANSWER_CHECKS", "EXAMPLE_PROBLEM", "EXAMPLE_SOLUTION", "FORMS", "HELD_OUT_TEMPLATES",
    "INSTRUCTION", "OPERATORS", "SPLITS", "TEMPLATES", "WORKED_EXAMPLES", "Problem",
    "WordProblemsConfig",
    "answer_alone", "answer_format", "breakdown", "correct", "correct_once", "correct_strict",
    "final_number", "generate_dataset", "math_verified", "messages", "stated_answer",
]  # fmt: skip

OPERATORS = ("+", "-", "*", "/")
SPLITS = ("train", "heldout_numbers", "heldout_phrasings", "heldout_bare")
HELD_OUT_PHRASINGS = ("heldout_phrasings", "heldout_bare")
"""The splits told only with held-out phrasings."""


@dataclass(frozen=True)
class WordProblemsConfig:
    """Mix and difficulty of the generated problems."""

    operation_weights: tuple[float, ...] = (0.5, 0.3, 0.2)
    """Relative frequency of problems with 1, 2, 3, ... operations (one weight per count)."""
    train_operation_weights: tuple[float, ...] | None = None
    """The training split's mix instead (a curriculum); the held-out splits keep the above."""
    operators: tuple[str, ...] = OPERATORS
    """Operators drawn uniformly for each step, from "+", "-", "*", "/"."""
    max_start: int = 10
    """The starting count is uniform over [2, max_start]."""
    max_addend: int = 10
    """A "+" adds, and a "-" removes, between 2 and this many (never reaching 0)."""
    max_factor: int = 3
    """A "*" multiplies, and a "/" divides exactly, by 2 to this number."""
    max_value: int = 100
    """No count along the way exceeds this."""
    held_out_fraction: float = 0.2
    """Share of all equations reserved for the held-out splits (chosen by a hash)."""
    worked_example: bool | str = True
    """The worked example (a user turn and its answer) a scaffold shows before the problem:
    true or "story" (two operations told as a story), "one_step" (one operation answered
    with its equation alone), or false (none). Read as the example's name, None for none."""
    prompt_form: str = "chat"
    """chat: messages, through the model's chat template; plain: the same as "Question: ...
    Answer:" text for a base model (`grpo.lm.prompt_forms.plain_text`)."""
    train_forms: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TRAIN_FORMS))
    """How the training problems are asked: a weight per form of `FORMS` (scaffold: the
    instruction, the worked example, the problem, as the scaffolded held-out splits ask;
    instruction: the instruction and the problem; bare: the problem alone, as heldout_bare
    asks), each row's form drawn from the task seed apart from its problem. The default asks
    every row in the scaffold; the held-out splits never change with it."""

    def __post_init__(self) -> None:
        for name in ("operation_weights", "train_operation_weights"):
            weights = getattr(self, name)
            if weights is None and name == "train_operation_weights":
                continue
            weights = tuple(weights)
            if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
                raise ValueError(f"{name} must be non-negative with a positive sum, got {weights!r}")
            object.__setattr__(self, name, weights)
        ops = tuple(self.operators)
        if not ops or any(op not in OPERATORS for op in ops):
            raise ValueError(f"operators must be a non-empty subset of {OPERATORS}, got {ops!r}")
        object.__setattr__(self, "operators", ops)
        for name, low in (("max_start", 2), ("max_addend", 1), ("max_factor", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.max_value, int) or self.max_value < self.max_start:
            raise ValueError(f"max_value must be an integer >= max_start, got {self.max_value!r}")
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction!r}")
        if self.prompt_form not in PROMPT_FORMS:
            raise ValueError(f"prompt_form must be one of {PROMPT_FORMS}, got {self.prompt_form!r}")
        object.__setattr__(self, "train_forms", check_train_forms(self.train_forms))
        object.__setattr__(self, "worked_example", check_worked_example(self.worked_example))


@dataclass(frozen=True)
class Problem:
    """One problem's structure; its text and answer follow from it."""

    start: int
    steps: tuple[tuple[str, int], ...]  # (operator, number) applied in order
    phrasings: tuple[int, ...]  # template index: start, one per step, question
    name: str
    other: str
    objects: str

    @property
    def equation(self) -> str:
        """The numbers alone, e.g. "7+5*3" applied left to right: what the split hashes."""
        return str(self.start) + "".join(f"{op}{n}" for op, n in self.steps)

    @property
    def answer(self) -> int:
        value = self.start
        for op, n in self.steps:
            value = _apply(op, value, n)
        return value

    @property
    def text(self) -> str:
        kinds = ["start", *(op for op, _ in self.steps), "question"]
        numbers = [self.start, *(n for _, n in self.steps), 0]
        fields = {"name": self.name, "other": self.other, "objects": self.objects}
        return " ".join(
            TEMPLATES[kind][i].format(n=n, **fields)
            for kind, i, n in zip(kinds, self.phrasings, numbers, strict=True)
        )


def _apply(op: str, value: int, n: int) -> int:
    if op == "/":
        assert value % n == 0, "division steps are drawn exact"
        return value // n
    return {"+": value + n, "-": value - n, "*": value * n}[op]


def _phrasings(kind: str, split: str) -> range:
    """Template indices of a sentence kind that `split` may use."""
    total = len(TEMPLATES[kind])
    cut = total - HELD_OUT_TEMPLATES
    return range(cut, total) if split in HELD_OUT_PHRASINGS else range(cut)


def _draw_step(
    rng: random.Random, value: int, config: WordProblemsConfig
) -> tuple[str, int] | None:
    """One (operator, number) keeping the count a positive integer <= max_value; None = retry."""
    op = rng.choice(config.operators)
    if op == "+":
        n = rng.randint(2, config.max_addend)
    elif op == "-":
        if value < 3:
            return None
        n = rng.randint(2, min(config.max_addend, value - 1))
    else:
        n = rng.randint(2, config.max_factor)
        if op == "/" and value % n:
            return None
    return (op, n) if _apply(op, value, n) <= config.max_value else None


def _draw_problem(rng: random.Random, config: WordProblemsConfig, split: str) -> Problem | None:
    weights = config.operation_weights
    if split == "train" and config.train_operation_weights is not None:  # a curriculum
        weights = config.train_operation_weights
    count = rng.choices(range(1, len(weights) + 1), weights)[0]
    value = start = rng.randint(2, config.max_start)
    steps = []
    for _ in range(count):
        # a few tries per step, so that the operation counts keep their weights
        step = next(filter(None, (_draw_step(rng, value, config) for _ in range(20))), None)
        if step is None:
            return None
        steps.append(step)
        value = _apply(step[0], value, step[1])
    kinds = ["start", *(op for op, _ in steps), "question"]
    name, other = rng.sample(NAMES, 2)
    phrasings = tuple(rng.choice(_phrasings(kind, split)) for kind in kinds)
    return Problem(start, tuple(steps), phrasings, name, other, rng.choice(OBJECTS))


def generate_dataset(
    num_problems: int,
    *,
    split: str = "train",
    seed: int = 0,
    config: WordProblemsConfig | None = None,
) -> list[dict[str, Any]]:
    """`num_problems` distinct rows ``{"prompt", "answer", "operations", "equation"}`` of
    `split`, the same for the same seed; a ValueError says when the split has too few
    distinct problems. The training rows' problems do not depend on `train_forms`: only how
    each is asked does."""
    config = config or WordProblemsConfig()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 0:
        raise ValueError(f"num_problems must be a non-negative integer, got {num_problems!r}")
    rng = random.Random(f"word_problems/{split}/{seed}")  # str seeds hash stably across runs
    equations = "train" if split == "train" else "held_out"
    drawn: dict[str, Problem] = {}

    def draw() -> str | None:
        problem = _draw_problem(rng, config, split)
        if problem is None or hash_split(problem.equation, config.held_out_fraction) != equations:
            return None
        drawn[problem.text] = problem
        return problem.text

    texts = draw_distinct(
        num_problems, draw, lambda text: True,
        shortfall=lambda found: (
            f"num_problems={num_problems} distinct {split!r} problems could not be drawn "
            f"(found {found}); raise max_start, max_addend or held_out_fraction"
        ),
    )  # fmt: skip
    if split == "train":
        forms = draw_forms(len(texts), seed, config.train_forms)
    else:
        forms = [HELD_OUT_FORMS[split]] * len(texts)
    return [
        {
            "prompt": in_form(FORMS[form](text, config.worked_example), config.prompt_form),
            "answer": str(drawn[text].answer),
            "operations": len(drawn[text].steps),
            "equation": drawn[text].equation,
        }
        for text, form in zip(texts, forms, strict=True)
    ]


# ---- rewards: the reward contract, reading the "answer" column ----

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_STATED = re.compile(r"Answer\**:\**\s*\**\s*\$?\s*(-?\d+(?:,\d{3})*)(?![\d.,]*\d)")


def _to_int(token: str) -> int | None:
    """ "1,200" -> 1200, "12.0" -> 12, "12.5" -> None."""
    whole, _, fraction = token.replace(",", "").partition(".")
    return int(whole) if not fraction.strip("0") else None


def final_number(text: str) -> int | None:
    """The last number written in `text` as an integer (None: no number, or not whole)."""
    numbers = _NUMBER.findall(text)
    return _to_int(numbers[-1]) if numbers else None


def stated_answer(text: str) -> int | None:
    """N of the last "Answer: N" in `text` (N a whole number); None when there is none."""
    found = _STATED.findall(text)
    return _to_int(found[-1]) if found else None


def _text(completion: Any, index: int) -> str:
    if not isinstance(completion, str):
        raise TypeError(f"completions[{index}] must be a str, got {type(completion).__name__}")
    return completion


def _scores(
    read: Callable[[str], int | None], completions: Sequence[Any], answer: Sequence[Any]
) -> list[float]:
    if len(completions) != len(answer):
        raise ValueError(f"completions and answer must have the same length, got "
                         f"{len(completions)} and {len(answer)}")  # fmt: skip
    return [
        1.0 if read(_text(c, i)) == int(a) else 0.0
        for i, (c, a) in enumerate(zip(completions, answer, strict=True))
    ]


def correct(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **_: Any):
    """1.0 where the completion's final number equals the answer (lenient), else 0.0."""
    return _scores(final_number, completions, answer)


def correct_strict(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **_: Any
) -> list[float]:
    """1.0 where the completion states "Answer: N" and N is the answer, else 0.0."""
    return _scores(stated_answer, completions, answer)


def answer_alone(text: str) -> int | None:
    """N of the first "Answer: N" in `text` when no number follows it; None otherwise."""
    first = _STATED.search(text)
    if first is None or _NUMBER.search(text, first.end()) is not None:
        return None
    return _to_int(first.group(1))


def correct_once(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **_: Any
) -> list[float]:
    """1.0 where the completion's first "Answer: N" gives the answer and no number follows
    it, else 0.0: a reply that states a second answer, or runs on with more numbers after its
    answer (a line of "Answer: N" repeated to the token limit), scores 0, so it cannot win by
    a later guess, and a right answer that runs on scores below the same answer stopped."""
    return _scores(answer_alone, completions, answer)


def answer_format(prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
    """1.0 where the completion states "Answer: N" with a whole number N, right or wrong.

    The same on every row, whichever form (`train_forms`) its prompt was asked in, the bare
    rows included, though they never ask for "Answer: N": the reward stays a function of the
    reply alone, as the held-out evaluation computes it; the bare split is scored by the
    reply's final number, which a closing "Answer: N" states, so the bonus does not pull a
    bare reply away from what it is scored on; and at the default weight (0.1 against 1 for
    the value) it never outweighs a right answer. A bare group whose samples never state the
    format gets no signal from it."""
    return [float(stated_answer(_text(c, i)) is not None) for i, c in enumerate(completions)]


def math_verified(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **_: Any
) -> list[float]:
    """1.0 where math-verify finds the completion's answer equal to the answer, else 0.0."""
    from grpo.rewards.math import math_answer_reward  # layer 2: the math extra

    return [float(s or 0.0) for s in math_answer_reward(prompts, completions, answer)]


ANSWER_CHECKS: dict[str, Callable[..., list[float]]] = {
    "integer": correct, "once": correct_once, "math_verify": math_verified,
}  # fmt: skip
"""How the training reward `correct` reads the answer: the final number, parsed exactly
(integer); the first "Answer: N" with no number after it (once); or math-verify. Held-out
accuracy is always `breakdown`'s (the final number, and "Answer: N" for the strict one)."""


def breakdown(rows: Sequence[Mapping[str, Any]], completions: Sequence[str]) -> dict[str, float]:
    """Evaluation metrics of one completion per row: accuracy (lenient), accuracy_strict,
    answer_format, the number of distinct equations (num_equations) and the accuracy's
    standard error clustered by equation (accuracy_se), and both accuracies per number of
    operations (accuracy_ops1, ...)."""
    answers = [row["answer"] for row in rows]
    lenient = correct([], completions, answers)
    strict = correct_strict([], completions, answers)
    equations = [row["equation"] for row in rows]
    metrics = {
        "accuracy": _mean(lenient),
        "accuracy_se": clustered_standard_error(lenient, equations) if rows else float("nan"),
        "num_equations": float(len(set(equations))),
        "accuracy_strict": _mean(strict),
        "answer_format": _mean(answer_format([], completions)),
    }
    for count in sorted({row["operations"] for row in rows}):
        picked = [i for i, row in enumerate(rows) if row["operations"] == count]
        metrics[f"accuracy_ops{count}"] = _mean([lenient[i] for i in picked])
        metrics[f"accuracy_strict_ops{count}"] = _mean([strict[i] for i in picked])
        metrics[f"num_problems_ops{count}"] = float(len(picked))
    return metrics


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
