"""Held-out evaluations of a finished run's checkpoints, off the run's clock.

    python bench/evaluate_checkpoints.py runs/smollm2_math --steps 16 24 32
    python bench/run_curve.py runs/smollm2_math        # the curve, these points included

A run with `run.checkpoint_every: 4` and a large `run.keep_checkpoints` keeps
the policy every 4 steps; evaluating them afterwards draws the curve at that
resolution without evaluations inside the run (which leave its training as it
is, but cost wall time). The task is built once from the run's own
`config.yaml` (model, held-out splits, evaluator), each checkpoint's policy is
loaded into it in turn (`grpo.run.rundir.read_checkpoint`, verified against its
manifest), and one JSON line per checkpoint, `{"step": N, "eval/...": ...}`,
is appended to RUN_DIR/checkpoint_evals.jsonl; `bench/run_curve.py` reads
those lines as evaluations at their steps, in place of the run's own there.
Step 0 is the model the run started from (`model.path`). A step already there
is skipped, so the script can be stopped and run again.

`--set KEY=VALUE` overrides the run's config for the evaluation, e.g.
`--set task.eval_size=200` for a run trained with a token `task.eval_size`
(its start and end evaluations then cost seconds; the held-out splits are
drawn apart from the training set, so their size leaves the training as it is).
Each line records its overrides, and a step counts as done only with the same.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

OUTPUT = "checkpoint_evals.jsonl"


def done_steps(run_dir: Path, overrides: list[str]) -> set[int]:
    """Steps already evaluated with these overrides."""
    path = run_dir / OUTPUT
    if not path.is_file():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["step"] for row in rows if row.get("overrides", []) == overrides}


def load_checkpoint(policy, folder: Path) -> None:
    """The policy of checkpoint folder RUN_DIR/checkpoints/step-N into `policy`, in place
    (verified against the checkpoint's manifest first)."""
    from grpo.checkpoint import load_model_state
    from grpo.run.rundir import read_checkpoint

    load_model_state(policy, read_checkpoint(folder)["trainer"]["policy"])


def main(argv: list[str] | None = None) -> None:
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config
    from grpo.run.rundir import RunDirectory
    from grpo.run.train import seed_everything

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, nargs="*", help="these steps only (default: all kept)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override the run's config for the evaluation (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    run = RunDirectory(args.run_dir)
    kept = run.complete_steps()
    wanted = kept if args.steps is None else args.steps
    missing = sorted(set(wanted) - set(kept) - {0})  # step 0: the model the run started from
    if missing:
        raise SystemExit(f"{args.run_dir}: no checkpoint of step(s) {missing}; kept: {kept}")
    config = load_config(str(run.config), args.overrides)
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    parts = build_task(config)
    if parts.evaluate is None:
        raise SystemExit(f"{run.config}: the task has no held-out set (task.eval_size: 0?)")
    for step in sorted(set(wanted) - done_steps(args.run_dir, args.overrides)):
        start = time.perf_counter()
        if step:  # step 0 comes first, before any checkpoint is loaded
            load_checkpoint(parts.policy, run.checkpoints / f"step-{step:06d}")
        metrics, _ = parts.evaluate()
        with (args.run_dir / OUTPUT).open("a") as out:
            row = {"step": step, **metrics}
            if args.overrides:
                row["overrides"] = args.overrides
            out.write(json.dumps(row) + "\n")
        headline = "  ".join(f"{k} {metrics[k]:.4f}" for k in parts.headline if k in metrics)
        print(f"step {step}: {headline}  ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
