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
those lines as evaluations at their steps. A step already there is skipped,
so the script can be stopped and run again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

OUTPUT = "checkpoint_evals.jsonl"


def done_steps(run_dir: Path) -> set[int]:
    path = run_dir / OUTPUT
    if not path.is_file():
        return set()
    return {json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()}


def main(argv: list[str] | None = None) -> None:
    from grpo.checkpoint import load_model_state
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config
    from grpo.run.rundir import RunDirectory, read_checkpoint
    from grpo.run.train import seed_everything

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, nargs="*", help="these steps only (default: all kept)")
    args = parser.parse_args(argv)
    run = RunDirectory(args.run_dir)
    kept = run.complete_steps()
    wanted = kept if args.steps is None else args.steps
    missing = sorted(set(wanted) - set(kept))
    if missing:
        raise SystemExit(f"{args.run_dir}: no checkpoint of step(s) {missing}; kept: {kept}")
    config = load_config(str(run.config), [])
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    parts = build_task(config)
    if parts.evaluate is None:
        raise SystemExit(f"{run.config}: the task has no held-out set (task.eval_size: 0?)")
    for step in sorted(set(wanted) - done_steps(args.run_dir)):
        start = time.perf_counter()
        folder = run.checkpoints / f"step-{step:06d}"
        load_model_state(parts.policy, read_checkpoint(folder)["trainer"]["policy"])
        metrics, _ = parts.evaluate()
        with (args.run_dir / OUTPUT).open("a") as out:
            out.write(json.dumps({"step": step, **metrics}) + "\n")
        headline = "  ".join(f"{k} {metrics[k]:.4f}" for k in parts.headline if k in metrics)
        print(f"step {step}: {headline}  ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
