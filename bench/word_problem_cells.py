"""The cells of `bench/word_problem_diagnosis.py`: pure functions of held-out rows and replies.

A row is a word problem as `grpo.tasks.word_problems.generate_dataset` writes it (its
"answer" and "equation" read here); a reply is the model's text for it. Per reply
(`outcomes`), each a 0/1 unless said:

- accuracy: the reply's final number is the answer (the task's `correct`);
- strict: a stated "Answer: N" is the answer (`correct_strict`);
- format: an "Answer: N" is stated, right or wrong (`answer_format`);
- example_overlap (a share): of the reply's word pairs (letters only, lower case), those the
  worked example's solution also has: its wording copied;
- example_answer: the final number is the worked example's answer on a problem whose answer
  differs: its number copied.

A cell (`cells`) is a group of problems: every one ("all"), those of k operations ("steps k"),
those whose last operation (the one that yields the answer; a one-step problem's only one) is
op ("last op op"), and those by the largest number their computation involves (operands,
intermediate counts and answer: "largest <10", "10-19", ">=20"; `SIZE_BUCKETS`, chosen from the
task's ranges: start and addends <= 10, factors <= 3, counts <= 100, so operands alone are
all below 11). It holds its problems (n), distinct equations, each figure's mean with its
standard error clustered by equation (`grpo.tasks.clustered_standard_error`: problems sharing
an equation are not independent), and right_when_stated: strict among the replies that state
an answer (over `stated` of them). `changes` gives a later model's change in accuracy, strict
and format on the same problems, paired reply by reply, with its own clustered error.
Undefined figures (no replies; fewer than two equations for an error) are None.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from grpo.tasks import clustered_standard_error
from grpo.tasks import word_problems as wp

__all__ = ["CHANGED", "SIZE_BUCKETS", "cells", "changes", "example_overlap", "groups",
           "outcomes", "tabulate"]  # fmt: skip

SIZE_BUCKETS = ((10, "<10"), (20, "10-19"), (math.inf, ">=20"))
"""(bound, label): a problem's largest number is below the first bound it meets."""
GROUP_KINDS = ("all", "steps", "last op", "largest")
CHANGED = ("accuracy", "strict", "format")
"""The figures whose change from the model before is reported."""
EXAMPLE_ANSWER = wp.stated_answer(wp.EXAMPLE_SOLUTION)


def groups(equation: str) -> tuple[str, ...]:
    """The cells a problem counts in, e.g. "7+5*3" -> ("all", "steps 2", "last op *",
    "largest >=20"): 7 + 5 = 12, 12 * 3 = 36."""
    numbers = [int(n) for n in re.findall(r"\d+", equation)]
    steps = tuple(zip(re.findall(r"[-+*/]", equation), numbers[1:], strict=True))
    # the count after each step, by the task's own arithmetic
    counts = [wp.Problem(numbers[0], steps[:k], (), "", "", "").answer
              for k in range(len(steps) + 1)]  # fmt: skip
    largest = max(*numbers, *counts)
    size = next(label for bound, label in SIZE_BUCKETS if largest < bound)
    return ("all", f"steps {len(steps)}", f"last op {steps[-1][0]}", f"largest {size}")


def _group_rank(group: str) -> tuple[int, int]:
    """Reading order: all, steps 1.., last op + - * /, largest small to large."""
    kind = next(k for k in GROUP_KINDS if group.startswith(k))
    value = group.removeprefix(kind).strip()
    ranks = {"all": lambda v: 0, "steps": int, "last op": wp.OPERATORS.index,
             "largest": [label for _, label in SIZE_BUCKETS].index}  # fmt: skip
    return GROUP_KINDS.index(kind), ranks[kind](value)


def _bigrams(text: str) -> list[tuple[str, str]]:
    words = re.findall(r"[a-z]+", text.lower())
    return list(zip(words, words[1:], strict=False))  # each word with the next


EXAMPLE_BIGRAMS = frozenset(_bigrams(wp.EXAMPLE_SOLUTION))


def example_overlap(completion: str) -> float:
    """Share of the reply's word pairs found in the worked example's solution; 0.0 for a reply
    of fewer than two words."""
    pairs = _bigrams(completion)
    return sum(p in EXAMPLE_BIGRAMS for p in pairs) / len(pairs) if pairs else 0.0


def outcomes(rows: Sequence[dict], completions: Sequence[str]) -> dict[str, list[float]]:
    """Figure -> its value per reply (one reply a row), as the module docstring defines them."""
    answers = [row["answer"] for row in rows]
    copied = [float(wp.final_number(c) == EXAMPLE_ANSWER != int(a))
              for c, a in zip(completions, answers, strict=True)]  # fmt: skip
    return {
        "accuracy": wp.correct([], completions, answers),
        "strict": wp.correct_strict([], completions, answers),
        "format": wp.answer_format([], completions),
        "example_overlap": [example_overlap(c) for c in completions],
        "example_answer": copied,
    }


def _summary(values: Sequence[float], equations: Sequence[str]) -> tuple[float | None, ...]:
    """(mean, standard error clustered by equation); None where undefined."""
    if not values:
        return None, None
    se = clustered_standard_error(values, equations)
    return math.fsum(values) / len(values), None if math.isnan(se) else se


def _by_group(rows: Sequence[dict]) -> dict[str, list[int]]:
    """Group -> the indices of its rows, groups in reading order."""
    found: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        for group in groups(row["equation"]):
            found.setdefault(group, []).append(i)
    return {g: found[g] for g in sorted(found, key=_group_rank)}


def cells(rows: Sequence[dict], completions: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Group -> {"n", "equations", each figure and its "_se", "stated", "right_when_stated"
    and its "_se"} of one reply a row."""
    values = outcomes(rows, completions)
    equations = [row["equation"] for row in rows]
    table = {}
    for group, picked in _by_group(rows).items():
        eqs = [equations[i] for i in picked]
        cell: dict[str, Any] = {"n": len(picked), "equations": len(set(eqs))}
        for metric, column in values.items():
            cell[metric], cell[f"{metric}_se"] = _summary([column[i] for i in picked], eqs)
        stated = [i for i in picked if values["format"][i]]
        cell["stated"] = len(stated)
        cell["right_when_stated"], cell["right_when_stated_se"] = _summary(
            [values["strict"][i] for i in stated], [equations[i] for i in stated]
        )
        table[group] = cell
    return table


def changes(rows: Sequence[dict], before: Sequence[str], after: Sequence[str]) -> dict[str, dict]:
    """Group -> {"n", each `CHANGED` figure after minus before, and its "_se"}: the same
    problems answered twice, so the change is a mean of per-problem differences."""
    old, new = outcomes(rows, before), outcomes(rows, after)
    equations = [row["equation"] for row in rows]
    table = {}
    for group, picked in _by_group(rows).items():
        eqs = [equations[i] for i in picked]
        cell: dict[str, Any] = {"n": len(picked)}
        for metric in CHANGED:
            gains = [new[metric][i] - old[metric][i] for i in picked]
            cell[metric], cell[f"{metric}_se"] = _summary(gains, eqs)
        table[group] = cell
    return table


def tabulate(rows: dict[str, list[dict]], replies: dict[str, dict[str, dict[str, list[str]]]]
             ) -> dict[str, dict]:  # fmt: skip
    """From replies[model][split][form] (one a row of rows[split]): {"cells": model -> split
    -> form -> group -> cell, "changes": every model but the first -> split -> form -> group ->
    change from the first}; the splits include "pooled", every split's rows together."""
    every = [row for split_rows in rows.values() for row in split_rows]
    splits = {**rows, "pooled": every}
    pooled = {}  # model -> split -> form -> replies, "pooled" included
    for model, by_split in replies.items():
        forms = by_split[next(iter(rows))]
        together = {form: [t for split in rows for t in by_split[split][form]] for form in forms}
        pooled[model] = {**by_split, "pooled": together}
    first = next(iter(pooled))
    found: dict[str, dict] = {"cells": {}, "changes": {}}
    for model, by_split in pooled.items():
        found["cells"][model] = {
            split: {form: cells(splits[split], texts) for form, texts in by_form.items()}
            for split, by_form in by_split.items()
        }
        if model != first:
            found["changes"][model] = {
                split: {form: changes(splits[split], pooled[first][split][form], texts)
                        for form, texts in by_form.items()}
                for split, by_form in by_split.items()
            }  # fmt: skip
    return found
