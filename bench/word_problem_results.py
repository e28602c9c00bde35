"""The word-problem diagnosis tables (docs/word_problems.md), rendered by `bench/render_results.py`.

Reads the record `word_problem_diagnosis` (`bench/word_problem_diagnosis.py --record
word_problem_diagnosis`; its cells are those of `bench/word_problem_cells.py`). `render` takes
the records and the `source` function that writes where the numbers come from.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

NAME = "word_problem_diagnosis"
SPLITS = {"heldout_numbers": "new numbers", "heldout_phrasings": "unseen phrasings",
          "heldout_bare": "bare-split problems", "pooled": "all"}  # fmt: skip
FORMS = {"full": "full scaffold", "no_example": "instruction, no example",
         "bare": "bare question", "example_only": "example, no instruction"}  # fmt: skip
ASKED = {"full": "the instruction with its `Answer: N` request, one worked example, the problem",
         "no_example": "the instruction and the problem", "bare": "the problem alone",
         "example_only": "the worked example and the problem"}  # fmt: skip
OPS = {"+": "+", "-": "−", "*": "×", "/": "÷"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _with_se(value: float | None, se: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    shown = f"{100 * value:+.1f}" if signed else _pct(value)
    return shown if se is None else f"{shown} ± {100 * se:.1f}"


def _group_name(group: str) -> str:
    kind, _, value = group.rpartition(" ")
    if not kind:
        return "every problem"
    if kind == "steps":
        return f"{value} step{'' if value == '1' else 's'}"
    if kind == "last op":
        return f"last step {OPS[value]}"
    return f"largest number {value}"


def _by_form(r: dict) -> str:
    """Rows split (all pooled first) x form: each figure before -> after, and each later
    model's change in final number right."""
    labels = [m["label"] for m in r["models"]]
    head = ["problems", "prompt", "n", "states `Answer: N`", "stated answer right",
            "final number right", *(f"change at {label}" for label in labels[1:])]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for split, form in itertools.product(["pooled", *r["splits"]], r["forms"]):
        cells = [r["cells"][label][split][form]["all"] for label in labels]
        figures = [" → ".join(_pct(c[key]) for c in cells)
                   for key in ("format", "strict", "accuracy")]  # fmt: skip
        changed = [r["changes"][label][split][form]["all"] for label in labels[1:]]
        gains = [_with_se(c["accuracy"], c["accuracy_se"], signed=True) for c in changed]
        row = [SPLITS[split], FORMS[form], str(cells[0]["n"]), *figures, *gains]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def _by_group(r: dict) -> str:
    """Pooled problems by kind: final number right per form, before -> last model (change);
    the model before alone when the record has no other."""
    first, last = r["models"][0]["label"], r["models"][-1]["label"]
    pooled = r["cells"][first]["pooled"]
    head = ["problems", "n", *(FORMS[form] for form in r["forms"])]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group, cell in pooled[r["forms"][0]].items():
        cells = []
        for form in r["forms"]:
            before = pooled[form][group]
            if last == first:
                cells.append(_with_se(before["accuracy"], before["accuracy_se"]))
                continue
            after = r["cells"][last]["pooled"][form][group]["accuracy"]
            change = r["changes"][last]["pooled"][form][group]
            gain = _with_se(change["accuracy"], change["accuracy_se"], signed=True)
            cells.append(f"{_pct(before['accuracy'])} → {_pct(after)} ({gain})")
        rows.append(f"| {_group_name(group)} | {cell['n']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _copying(r: dict) -> str:
    """Every problem pooled, per form and model: format, right when stated, copying."""
    head = ["prompt", "model", "states `Answer: N`", "right when stated", "final number right",
            "example's word pairs", "example's answer"]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for form in r["forms"]:
        for model in r["models"]:
            c = r["cells"][model["label"]]["pooled"][form]["all"]
            stated = (f"{_with_se(c['right_when_stated'], c['right_when_stated_se'])} "
                      f"(of {c['stated']})")  # fmt: skip
            shown = {
                k: _with_se(c[k], c[f"{k}_se"])
                for k in ("format", "accuracy", "example_overlap", "example_answer")
            }
            figures = [shown["format"], stated, shown["accuracy"], shown["example_overlap"],
                       shown["example_answer"]]  # fmt: skip
            rows.append(f"| {FORMS[form]} | {model['label']} | " + " | ".join(figures) + " |")
    return "\n".join(rows)


def render(records: dict, source: Callable[..., str]) -> str:
    """The three tables, what their figures mean, and where they come from."""
    record = records[NAME]
    r = record["results"]
    last = r["models"][-1]["label"]
    first = r["cells"][r["models"][0]["label"]]
    every = [first[s][r["forms"][0]]["all"] for s in r["splits"]]
    sizes = "; ".join(f"{SPLITS[s]}: {c['n']} problems of {c['equations']} distinct equations"
                      for s, c in zip(r["splits"], every, strict=True))  # fmt: skip
    forms = "; ".join(f"*{FORMS[form]}*: {ASKED[form]}" for form in r["forms"])
    notes = (
        "The same held-out problems, answered greedy by the model before training and after, "
        f"in each prompt form ({forms}). Percent of problems; ± one standard error clustered "
        "by equation (problems that share an equation are not independent); a change is "
        "paired, problem by problem. "
        f"Problems: {sizes}. *States `Answer: N`*: the reply has one; *stated answer right*: it "
        "is the answer; *final number right*: the reply's last number is (the accuracy the "
        "task reports); *right when stated*: the stated answer is right, among the replies "
        "that state one; *example's word pairs*: the share of the reply's word pairs found in "
        "the worked example's solution; *example's answer*: the reply ends on the example's "
        "answer where the problem's differs."
    )
    return "\n\n".join([
        "By prompt form (before → after):", _by_form(r),
        "Final number right by kind of problem, all splits"
        + (f", before → {last} (change):" if len(r["models"]) > 1 else ":"),
        _by_group(r),
        "Format and copying, all splits:", _copying(r),
        notes, source(record),
    ])  # fmt: skip
