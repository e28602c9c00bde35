"""The word-problem task's text (`grpo.tasks.word_problems`): how a story is told and asked.

`TEMPLATES` tells a story, sentence kind by sentence kind (the last phrasing of each kind
is held out: `HELD_OUT_TEMPLATES`). `FORMS` asks it: the full scaffold (the instruction,
one worked example of `WORKED_EXAMPLES`, the problem), the instruction alone before the
problem, or the problem alone. The held-out splits each use one form (`HELD_OUT_FORMS`); the training split draws
one per row from the weights of the task option `train_forms` (`draw_forms`), by default
the scaffold for every row. Only the standard library is imported here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "DEFAULT_TRAIN_FORMS", "EXAMPLE_PROBLEM", "EXAMPLE_SOLUTION", "FORMS", "HELD_OUT_FORMS",
    "HELD_OUT_TEMPLATES", "INSTRUCTION", "NAMES", "OBJECTS", "TEMPLATES", "WORKED_EXAMPLES",
    "check_train_forms", "check_worked_example", "draw_forms", "messages",
]  # fmt: skip

# Sentence kinds: "start", one per operator, "question". Fields: {name}, {other}, {objects}, {n}.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "start": (
        "{name} has {n} {objects}.",
        "{name} starts the day with {n} {objects}.",
        "There are {n} {objects} in {name}'s bag.",
    ),
    "+": (
        "{name} buys {n} more {objects}.",
        "{other} gives {name} {n} {objects}.",
        "Then {name} finds {n} more {objects}.",
        "{name}'s collection grows by {n} {objects}.",
    ),
    "-": (
        "{name} gives {n} {objects} to {other}.",
        "{name} loses {n} {objects}.",
        "Then {name} sells {n} of the {objects}.",
        "{other} takes {n} {objects} away from {name}.",
    ),
    "*": (
        "{name} ends up with {n} times as many {objects} as before.",
        "Then the number of {objects} {name} has becomes {n} times larger.",
        "{name} trades each of the {objects} for {n} new ones.",
        "{name} multiplies the pile of {objects} by {n}.",
    ),
    "/": (
        "{name} splits the {objects} into {n} equal groups and keeps one group.",
        "{name} keeps only one out of every {n} {objects}.",
        "Then {name} divides the {objects} equally among {n} boxes and keeps one box.",
        "{name} shares the {objects} equally between {n} people, {name} included, and keeps "
        "one share.",
    ),
    "question": (
        "How many {objects} does {name} have now?",
        "How many {objects} does {name} have at the end?",
        "What is the final number of {objects} that {name} owns?",
    ),
}
HELD_OUT_TEMPLATES = 1
"""The last this many phrasings of every sentence kind belong to "heldout_phrasings" only."""

NAMES = (
    "Ava", "Ben", "Chloe", "Daniel", "Emma", "Felix", "Grace", "Hugo", "Isla", "Jack",
    "Lena", "Leo", "Maya", "Noah", "Olivia", "Omar", "Priya", "Ravi", "Sofia", "Tom",
)  # fmt: skip
OBJECTS = (
    "apples", "marbles", "stickers", "pencils", "cookies", "books", "coins", "shells",
    "cards", "beads", "stamps", "balloons", "crayons", "buttons", "toy cars", "oranges",
)  # fmt: skip

INSTRUCTION = (
    "Solve the math word problem. Work it out step by step, then write the final answer "
    "on the last line as 'Answer: N', where N is a whole number."
)
EXAMPLE_PROBLEM = (
    "Mia has 5 stickers. Mia buys 3 more stickers. Then Mia sells 2 of the stickers. "
    "How many stickers does Mia have now?"
)
EXAMPLE_SOLUTION = (
    "Mia starts with 5 stickers. After buying 3 more she has 5 + 3 = 8. "
    "After selling 2 she has 8 - 2 = 6.\nAnswer: 6"
)
WORKED_EXAMPLES: dict[str, tuple[str, str]] = {
    # two operations, each told in a sentence of the story
    "story": (EXAMPLE_PROBLEM, EXAMPLE_SOLUTION),
    # one operation, answered with its equation alone
    "one_step": (
        "Mia has 5 stickers. Mia buys 3 more stickers. How many stickers does Mia have now?",
        "5 + 3 = 8.\nAnswer: 8",
    ),
}
"""The worked examples a scaffold can show, by name: (the problem, its answer)."""


def check_worked_example(value: Any) -> str | None:
    """The task option `worked_example` as a name of `WORKED_EXAMPLES`, or None for none:
    true is "story", false (or None) is none; anything else a ValueError naming the option."""
    if value is True or value is False or value is None:
        return "story" if value else None
    if value not in WORKED_EXAMPLES:
        allowed = ", ".join(["true", "false", *WORKED_EXAMPLES])
        raise ValueError(f"worked_example: got {value!r}; allowed: {allowed}")
    return value


def messages(problem_text: str, worked_example: bool | str | None = "story", bare: bool = False
             ) -> list[dict[str, str]]:  # fmt: skip
    """The chat prompt: the instruction, the worked example named (as the task option
    `worked_example`: none for None or false), then the problem; `bare`: the problem alone."""
    if bare:
        return [{"role": "user", "content": problem_text}]
    turns = [{"role": "system", "content": INSTRUCTION}]
    example = check_worked_example(worked_example)
    if example is not None:
        problem, answer = WORKED_EXAMPLES[example]
        turns += [{"role": "user", "content": problem}, {"role": "assistant", "content": answer}]
    return [*turns, {"role": "user", "content": problem_text}]


FORMS: dict[str, Callable[[str, str | None], list[dict[str, str]]]] = {
    "scaffold": lambda text, worked_example: messages(text, worked_example),
    "instruction": lambda text, worked_example: messages(text, worked_example=None),
    "bare": lambda text, worked_example: messages(text, bare=True),
}
"""How a problem is asked, as a function of (problem text, the name of the task's worked
example or None): scaffold, the instruction, the worked example (none for None) and the
problem; instruction, the instruction and the problem; bare, the problem alone as one user
turn (no instruction, so no request for "Answer: N")."""
HELD_OUT_FORMS = {"heldout_numbers": "scaffold", "heldout_phrasings": "scaffold",
                  "heldout_bare": "bare"}  # fmt: skip
"""The one form each held-out split is asked in, whatever the training mix."""
DEFAULT_TRAIN_FORMS = {"scaffold": 1.0}
"""Every training row asked in the scaffold, as the scaffolded held-out splits are."""


def check_train_forms(weights: Any) -> dict[str, float]:
    """`weights` (form -> weight) as floats in `FORMS`' order, so that the order a config
    writes them in changes no row; a ValueError naming train_forms for an unknown form, a
    weight that is not a finite number >= 0, or no positive weight."""
    allowed = ", ".join(FORMS)
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"train_forms must map forms ({allowed}) to weights, got {weights!r}")
    for form, weight in weights.items():
        if form not in FORMS:
            raise ValueError(f"train_forms: unknown form {form!r}; allowed: {allowed}")
        number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not number or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"train_forms.{form} must be a number >= 0, got {weight!r}")
    if sum(weights.values()) <= 0:
        raise ValueError(f"train_forms must give some form a positive weight, got {dict(weights)}")
    return {form: float(weights[form]) for form in FORMS if form in weights}


def draw_forms(count: int, seed: int, weights: Mapping[str, float]) -> list[str]:
    """The forms of the first `count` training rows, each drawn with probability its weight
    over their sum: the same for the same seed, and a prefix of a longer draw. Its own random
    stream, so the problems drawn (and their order) do not depend on the mix."""
    rng = random.Random(f"word_problems/train_forms/{seed}")  # a str seed hashes stably
    forms = list(weights)
    return rng.choices(forms, [weights[form] for form in forms], k=count)
