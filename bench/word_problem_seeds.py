"""The word-problem seeds table (README, docs/word_problems.md), rendered by `bench/render_results.py`.

Reads a `bench/train_seeds.py` record of a word-problem config: greedy accuracy per held-out
split at each evaluated step, per seed, each change from the seed's own start (seeds measured
on another CPU start elsewhere: greedy decoding rounds differently), the seeds' mean, and the
start's clustered standard error.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from provenance import percent

SPLIT_NAMES = {"heldout_numbers": "new numbers", "heldout_phrasings": "unseen phrasings",
               "heldout_bare": "bare question", "": "pooled"}  # fmt: skip


def _key(split: str, metric: str = "accuracy") -> str:
    """The greedy metric of a split ("": all splits pooled)."""
    return (f"eval/{split}/greedy/" if split else "eval/greedy/") + metric


def _split_cell(evaluation: dict, split: str) -> str:
    return percent(evaluation[_key(split)]) if _key(split) in evaluation else "-"


def _problems(evaluation: dict, split: str) -> int:
    prefix = _key(split, "num_problems_ops")
    return round(sum(v for k, v in evaluation.items() if k.startswith(prefix)))


def _gains(evaluations: list[dict], step: int, split: str) -> list[float]:
    """Each seed's change in points at `step` from its own start (its first evaluation)."""
    return [100 * (by_step[step][_key(split)] - by_step[min(by_step)][_key(split)])
            for by_step in evaluations]  # fmt: skip


def _change(gains: list[float]) -> str:
    """The seeds' mean change, with their standard deviation where there are several."""
    spread = f" ± {statistics.stdev(gains):.1f}" if len(gains) > 1 else ""
    return f"{statistics.fmean(gains):+.1f}{spread}"


def _mean_row(evaluations: list[dict], step: int, splits: list[str]) -> str:
    """The seeds' mean at `step`: each split's accuracy and its change from each seed's own
    start (its step-0 evaluation), with the seeds' standard deviation of that change."""
    cells = []
    for split in splits:
        mean = statistics.fmean(by_step[step][_key(split)] for by_step in evaluations)
        cells.append(f"{percent(mean)} ({_change(_gains(evaluations, step, split))})")
    return f"| mean (± seeds' s.d.) | {step} | | " + " | ".join(cells) + " |"


def _evaluations(record: dict) -> list[dict]:
    """Each seed's evaluations by step (those of its checkpoints, where they were made)."""
    return [{e["step"]: e for e in r.get("checkpoint_evaluations") or r["evaluations"]}
            for r in record["results"]["runs"]]  # fmt: skip


def summary(record: dict) -> str:
    """One line for the README's summary: each held-out split's change at the last step from
    each seed's own start (the mean, ± the seeds' s.d.), and the longest training time."""
    evaluations = _evaluations(record)
    last = max(evaluations[0])
    splits = [s for s in SPLIT_NAMES if s and _key(s) in evaluations[0][last]]
    changes = ", ".join(f"{SPLIT_NAMES[s]} {_change(_gains(evaluations, last, s))}" for s in splits)
    n = len(evaluations)
    seconds = max(by_step[last]["training_seconds"] for by_step in evaluations)
    who = f"mean ± s.d. of {n} seeds" if n > 1 else "1 seed"
    return (f"points gained by step {last} ({who}): {changes}; "
            f"{seconds:.0f} s of training at most")


def _start_rows(runs: list[dict], evaluations: list[dict], splits: list[str]) -> list[str]:
    """The step-0 row: one ("all") where every seed starts from the same accuracies, else one
    per distinct start, naming its seeds (greedy decoding rounds differently on another CPU)."""
    starts: dict[tuple[str, ...], list[str]] = {}
    for run, by_step in zip(runs, evaluations, strict=True):
        cells = tuple(_split_cell(by_step[min(by_step)], s) for s in splits)
        starts.setdefault(cells, []).append(str(run["seed"]))
    label = (lambda seeds: "all") if len(starts) == 1 else ", ".join
    return [f"| {label(seeds)} | 0 | 0 s | " + " | ".join(cells) + " |"
            for cells, seeds in starts.items()]  # fmt: skip


def render(records: dict, name: str, source: Callable[..., str],
           timing_note: Callable[[list[dict]], str]) -> str:
    """A `train_seeds.py` record of a word-problem config: greedy accuracy per held-out split
    at each evaluated step, per seed, with the start's clustered standard error; `source`
    says where the numbers come from, `timing_note` which runs' timing was flagged."""
    record = records[name]
    runs = record["results"]["runs"]
    evaluations = _evaluations(record)
    steps = sorted(evaluations[0])
    start = evaluations[0][steps[0]]
    splits = [s for s in SPLIT_NAMES if _split_cell(start, s) != "-"]
    head = ["seed", "step", "training", *(SPLIT_NAMES[s] for s in splits)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows += _start_rows(runs, evaluations, splits)
    for run, by_step in zip(runs, evaluations, strict=True):
        for step in steps[1:]:
            e = by_step[step]
            cells = []
            for split in splits:
                gain = 100 * (e[_key(split)] - by_step[steps[0]][_key(split)])
                cells.append(f"{_split_cell(e, split)} ({gain:+.1f})")
            rows.append(f"| {run['seed']} | {step} | {e['training_seconds']:.0f} s | "
                        + " | ".join(cells) + " |")  # fmt: skip
    if len(runs) > 1:
        rows.append(_mean_row(evaluations, steps[-1], splits))
    noise = "; ".join(
        f"{SPLIT_NAMES[s]} {100 * start[_key(s, 'accuracy_se')]:.1f} points over "
        f"{_problems(start, s)} problems of {start[_key(s, 'num_equations')]:.0f} distinct "
        "equations"
        for s in splits if _key(s, "accuracy_se") in start
    )  # fmt: skip
    last = [by_step[steps[-1]] for by_step in evaluations]
    peak = max(r["peak_rss_gib"] for r in runs)
    notes = (f"Greedy accuracy (the reply's final number); in brackets the change from the "
             f"seed's own start. One accuracy's standard error, clustered by equation (problems that "
             f"share an equation are not independent): {noise}. Training time is the sum "
             f"of the steps' times; the whole processes peaked at {peak:.2f} GiB. "
             f"{len(last)} seed{'' if len(last) == 1 else 's'}.")  # fmt: skip
    notes += timing_note(runs)
    return "\n".join(rows) + "\n\n" + notes + "\n\n" + source(record)
