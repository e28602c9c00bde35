"""Held-out accuracy of a `grpo train` run against its training seconds, with the training
metrics a user watches, from the run directory's metrics.jsonl.

    python bench/run_curve.py runs/smollm2_math --png docs/smollm2_math_run.png
    python bench/run_curve.py RUN_A RUN_B --keys eval/greedy/precision eval/greedy/coverage

Several runs share one figure, one line style each. `--keys` names other evaluation
metrics than the word-problem task's accuracies (shares in [0, 1], such as the chess task's).

Training seconds are the sum of `time/step` (sampling, rewards, loss, backward,
optimizer): evaluations and checkpoints are off the clock. Panels: greedy
accuracy per held-out split (and pooled) at each evaluation; then, per step,
reward, completion length, zero-std fraction, entropy, clip fraction and KL
(where logged). Prints the evaluation table. Evaluations of the run's
checkpoints made afterwards (`bench/evaluate_checkpoints.py`) join those made
during the run, and stand in their place at a step that has both.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SPLITS = {"pooled": "eval/greedy/accuracy",
          "new numbers": "eval/heldout_numbers/greedy/accuracy",
          "unseen phrasings": "eval/heldout_phrasings/greedy/accuracy",
          "bare question": "eval/heldout_bare/greedy/accuracy"}  # fmt: skip
WATCHED = ("reward/mean", "completion/length_mean", "reward/zero_std_frac", "entropy/mean",
           "clip/frac", "loss/kl")  # fmt: skip


def read(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training steps with their cumulative training and sampling seconds, evaluations with
    theirs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    steps, evaluations, clock = [], [], {"seconds": 0.0, "sampling_seconds": 0.0}
    for row in rows:
        if "time/step" in row:
            clock["seconds"] += row["time/step"]
            clock["sampling_seconds"] += row.get("time/sampling", 0.0)
            row["clip/frac"] = row.get("clip/low_frac", 0.0) + row.get("clip/high_frac", 0.0)
            steps.append({**row, **clock})
        elif any(key.startswith("eval/") for key in row):
            evaluations.append({**row, **clock})
    clocks = {row["step"]: row for row in steps}
    clocks[0] = {"seconds": 0.0, "sampling_seconds": 0.0}
    at_step = {e["step"]: e for e in evaluations}
    extra = run_dir / "checkpoint_evals.jsonl"  # bench/evaluate_checkpoints.py
    for line in extra.open() if extra.is_file() else ():  # in place of the run's own there
        row = json.loads(line)
        at = clocks[row["step"]]
        at_step[row["step"]] = {**row, "seconds": at["seconds"],
                                "sampling_seconds": at["sampling_seconds"]}  # fmt: skip
    return steps, sorted(at_step.values(), key=lambda e: e["step"])


STYLES = ("-", "--", ":", "-.")  # one per run in a figure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--keys", nargs="+", help="evaluation metrics (default: the accuracies)")
    parser.add_argument("--png", help="write the figure here")
    args = parser.parse_args(argv)
    names = [run_dir.name for run_dir in args.run_dirs]
    if len(set(names)) < len(names) or len(names) > len(STYLES):
        parser.error(f"at most {len(STYLES)} runs, with different folder names: got {names}")
    keys = {key.removeprefix("eval/"): key for key in args.keys} if args.keys else SPLITS
    runs = {run_dir.name: read(run_dir) for run_dir in args.run_dirs}
    for name, (_, evaluations) in runs.items():
        print(f"{name}\n| step | training s | " + " | ".join(keys) + " | greedy length |")
        print("|---|---|" + "---|" * (len(keys) + 1))
        for e in evaluations:
            cells = " | ".join(_cell(_value(e, key)) for key in keys.values())
            length = _value(e, "eval/greedy/length_mean")
            print(f"| {e['step']} | {e['seconds']:.0f} | {cells} | {length:.1f} |")
    if args.png:
        plot(runs, keys, args.png, "greedy accuracy (%)" if args.keys is None else "%")


def _value(row: dict, key: str) -> float:
    """The row's value of key; nan where it is missing or was logged as null (a nan)."""
    value = row.get(key)
    return float("nan") if value is None else float(value)


def _cell(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f} %"


def plot(runs: dict[str, tuple[list[dict], list[dict]]], keys: dict[str, str], path: str,
         ylabel: str) -> None:  # fmt: skip
    """Held-out metrics against training seconds, then the watched training metrics per step:
    one colour per metric, one line style per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    watched = [k for k in WATCHED if any(k in s for steps, _ in runs.values() for s in steps)]
    fig, axes = plt.subplots(1, 1 + len(watched), figsize=(3.2 * (1 + len(watched)), 3.2))
    for style, (run, (steps, evaluations)) in zip(STYLES, runs.items(), strict=False):
        prefix = f"{run}: " if len(runs) > 1 else ""
        for color, (name, key) in enumerate(keys.items()):
            axes[0].plot([e["seconds"] for e in evaluations],
                         [100 * _value(e, key) for e in evaluations], ls=style, marker="o",
                         color=f"C{color}", label=prefix + name)  # fmt: skip
        for ax, key in zip(axes[1:], watched, strict=True):
            ax.plot([s["step"] for s in steps], [_value(s, key) for s in steps], ls=style, lw=1,
                    color="C0", label=run)  # fmt: skip
            ax.set(xlabel="step", title=key)
    title = next(iter(runs)) if len(runs) == 1 else "held out"
    axes[0].set(xlabel="training seconds", ylabel=ylabel, title=title)
    axes[0].legend(fontsize=6)
    if len(runs) > 1:
        axes[-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
