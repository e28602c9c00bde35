"""The end-of-run picture: reward, KL and completion length over steps.

Reads the run's `metrics.jsonl` (written by `grpo.run.metrics.JsonlLogger`) so the
plot can be redrawn from any run directory, finished or not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["PANELS", "read_metrics", "plot_run"]

# (title, metric keys in order of preference): the first key a run logged is drawn.
PANELS = (
    ("reward", ("reward/mean",)),
    ("KL to reference", ("kl/mean",)),
    ("completion length", ("completion/length_mean", "completions/mean_length")),
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


def plot_run(metrics_path: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Draw one panel per entry of `PANELS` into a PNG; a metric never logged shows as empty."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for ax, (title, keys) in zip(axes, PANELS, strict=True):
        key = next((k for k in keys if any(r.get(k) is not None for r in rows)), None)
        if key is not None:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
            ax.set_ylabel(key)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
