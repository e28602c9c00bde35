"""The end-of-run picture: reward, KL, completion length and time per step by phase.

Reads the run's `metrics.jsonl` (written by `grpo.run.metrics.JsonlLogger`) so the
plot can be redrawn from any run directory, finished or not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo.step.timing import PHASES

__all__ = ["PANELS", "read_metrics", "plot_run", "phase_series"]

# the stacked layers of the time panel: the named phases, then the rest of the step
TIME_KEYS = tuple(f"time/{name}" for name in (*PHASES, "other"))

# (title, how it is drawn, metric keys): "line" draws the first key a run logged;
# "stack" stacks every key, so the top edge is their sum (for TIME_KEYS: time/step)
PANELS = (
    ("reward", "line", ("reward/mean",)),
    ("KL to reference", "line", ("kl/mean",)),
    ("completion length", "line", ("completion/length_mean", "completions/mean_length")),
    ("time per step by phase (s)", "stack", TIME_KEYS),
)


def read_metrics(path: str | os.PathLike[str]) -> list[dict]:
    """All rows of a metrics JSONL file; a half-written last line is skipped."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def phase_series(rows: list[dict], keys: tuple[str, ...]) -> tuple[list[int], dict[str, list]]:
    """Steps of the rows that logged all `keys`, and each key's values at those steps."""
    kept = [r for r in rows if all(r.get(k) is not None for k in keys)]
    return [r["step"] for r in kept], {k: [r[k] for r in kept] for k in keys}


def _line(ax: Any, rows: list[dict], keys: tuple[str, ...]) -> bool:
    key = next((k for k in keys if any(r.get(k) is not None for r in rows)), None)
    if key is None:
        return False
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
    ax.set_ylabel(key)
    return True


def _stack(ax: Any, rows: list[dict], keys: tuple[str, ...]) -> bool:
    steps, series = phase_series(rows, keys)
    if not steps:
        return False
    labels = [k.split("/", 1)[1] for k in keys]
    ax.stackplot(steps, *series.values(), labels=labels)
    ax.set_ylabel("seconds")
    ax.legend(loc="upper left", fontsize="x-small")
    return True


DRAW = {"line": _line, "stack": _stack}


def plot_run(metrics_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Draw one panel per entry of `PANELS` into a PNG; a metric never logged shows as empty."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (title, kind, keys) in zip(axes, PANELS, strict=True):
        if not DRAW[kind](ax, rows, keys):
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
