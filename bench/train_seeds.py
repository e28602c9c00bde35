"""A config trained on several seeds, one fresh `grpo train` process each, into one record.

    python bench/train_seeds.py configs/demo.yaml --name demo --seeds 0 1 2
    python bench/train_seeds.py configs/smollm2_math.yaml --name smollm2_math --seeds 0 1 2 \
        --set evaluation.every=0 --set run.checkpoint_every=16 --set run.keep_checkpoints=100 \
        --set task.eval_size=4 --evaluate-steps 0 32 64 --evaluate-set task.eval_size=200
    python bench/train_seeds.py ... --seeds 3 --add-to              # one more seed, same settings
    python bench/train_seeds.py ... --seeds 1 --add-to --remeasure  # seed 1 again (its timing)
    python bench/train_seeds.py ... --seeds 0 1 2 --settle 120      # the load settles between seeds

Each seed trains into its own run directory, `runs/bench/NAME/seed-S` (removed first, so a
second measurement never resumes or collides with the first), exactly as `grpo train CONFIG
--set seed=S` would, one after another. Per run the record keeps: the precision it computed in
(`policy.precision` as the run resolved it), the process's wall time, CPU time and peak RSS
(the child's own, from `os.wait4`), the load average just before it and the timing flags of
`common.timing_flags` (a run that shared the machine), the training seconds (the sum of
`time/step`: sampling, rewards, loss, backward, optimizer) and the median step, the training
metrics of `TRAINING_KEYS` (`training_summary`: their mean over the run, its first and its last
tenth), every held-out evaluation (those made during the run, and with `--evaluate-steps` those
of its checkpoints made afterwards by `bench/evaluate_checkpoints.py`, off the clock) and the
before/after table `grpo train` printed last. The record is bench/results/NAME.json
(`bench/records.py`); `bench/render_results.py` renders it into the pages. Each process runs
with `common.worker_env` (OpenMP threads that sleep while they wait). `--add-to` and
`--remeasure` join runs to a record measured earlier (`bench/seed_records.py`)."""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import busy_threads, settled_load, timing_flags, worker_env  # noqa: E402
from records import COMMAND_LINE, REPO, RESULTS, TRAINING_PATH, _git, machine, write_record  # noqa: E402
from seed_records import command_for, earlier_runs, join  # noqa: E402

EVALUATIONS = "checkpoint_evals.jsonl"  # bench/evaluate_checkpoints.py's output
TRAINING_KEYS = (  # the step metrics a record summarises (docs/metrics.md)
    "reward/mean", "reward/zero_std_frac", "loss/policy", "loss/kl", "loss/kl_share", "kl/mean",
    "entropy/mean", "completion/length_mean",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the YAML config, relative to the repository")
    parser.add_argument("--name", required=True, help="the record's name: bench/results/NAME.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="config overrides for every seed")
    parser.add_argument("--evaluate-steps", type=int, nargs="*", default=[],
                        help="checkpoint steps to evaluate after training (0: the start)")
    parser.add_argument("--evaluate-set", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides for those evaluations (e.g. task.eval_size=200)")
    parser.add_argument("--depends-on", nargs="*", default=[],
                        help="more files the result depends on (the config, its task module "
                             "and the training path are always included)")
    parser.add_argument("--add-to", action="store_true",
                        help="add these seeds' runs to the record NAME already measured: only "
                             "with its config, overrides and evaluations, none of its seeds, and "
                             "none of its files changed since (records.stale); each run keeps "
                             "the commit and date it was measured at (bench/seed_records.py)")
    parser.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                        help="before each seed, wait up to this long for the 1-minute load "
                             "average to fall to half the cores (the last seed's evaluations "
                             "raise it); its reading is what `load_before` records")
    parser.add_argument("--remeasure", action="store_true",
                        help="with --add-to: measure seeds the record holds again on the same "
                             "CPU, replacing their runs only if every evaluation and training "
                             "mean comes out equal (their timing was flagged, say)")
    parser.add_argument("--runs", default="runs/bench", help="parent of the run directories")
    parser.add_argument("--results", type=Path, default=None, help="record folder (tests)")
    return parser.parse_args(argv)  # fmt: skip


def run_seed(config: str, seed: int, run_dir: Path, overrides: list[str], threads: int,
             settle: float = 0.0) -> dict:  # fmt: skip
    """One `grpo train` process; its resources and its run directory's numbers. `settle`:
    seconds it may wait first for the load average to fall (`common.settled_load`)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "grpo", "train", config, "--set", f"seed={seed}",
           "--set", f"run.dir={_shown(run_dir)}"] + [a for o in overrides for a in ("--set", o)]  # fmt: skip
    load = settled_load(settle)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=worker_env())  # fmt: skip
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: grpo train exited {proc.returncode}:\n{output[-3000:]}")
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_times = [row["time/step"] for row in steps if "time/step" in row]
    cpu = usage.ru_utime + usage.ru_stime
    lines = output.rstrip().splitlines()
    table_start = max(i for i, line in enumerate(lines) if line.startswith("held-out evaluation"))
    return {
        "seed": seed,
        "run_dir": _shown(run_dir),
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
        "load_before": round(load, 2),
        "flags": timing_flags(load, cpu, wall, busy_threads(threads, worker_env())),
        "steps": len(step_times),
        # what `policy.precision` computed in, as the run resolved it (`auto`: fp32 or bf16-mixed)
        "precision": yaml.safe_load((run_dir / "config.yaml").read_text())["policy"]["precision"],
        "training_seconds": round(sum(step_times), 1),
        "median_step_seconds": round(statistics.median(step_times), 3) if step_times else None,
        "training": training_summary(steps),
        "evaluations": _evaluations(steps),
        "end_of_output": lines[table_start:],
    }


def training_summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """For each of `TRAINING_KEYS` the step rows log: its mean over every step ("all"), over
    the first tenth of them ("first") and over the last tenth ("last"), at least one step
    each."""
    steps = [row for row in rows if "time/step" in row]
    tenth = max(1, len(steps) // 10)
    summary = {}
    for key in TRAINING_KEYS:
        values = [row[key] for row in steps if key in row]
        if values:
            summary[key] = {name: round(statistics.fmean(part), 6) for name, part in
                            (("all", values), ("first", values[:tenth]), ("last", values[-tenth:]))}  # fmt: skip
    return summary


def _shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it."""
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def _evaluations(rows: list[dict]) -> list[dict]:
    """Each evaluation row's `eval/...` metrics with its step and training seconds so far."""
    clock, out = 0.0, []
    for row in rows:
        clock += row.get("time/step", 0.0)
        metrics = {k: v for k, v in row.items() if k.startswith("eval/") and "/rewards/" not in k}
        if metrics:
            out.append({"step": row["step"], "training_seconds": round(clock, 1), **metrics})
    return out


def evaluate_checkpoints(run: dict, steps: list[int], overrides: list[str]) -> list[dict]:
    """Evaluations of the run's checkpoints (`bench/evaluate_checkpoints.py`), with the
    training seconds at each step."""
    run_dir = REPO / run["run_dir"]
    cmd = [sys.executable, str(REPO / "bench" / "evaluate_checkpoints.py"), str(run_dir),
           "--steps", *map(str, steps)] + [a for o in overrides for a in ("--set", o)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    clock, at_step = 0.0, {0: 0.0}
    for row in rows:
        if "time/step" in row:
            clock += row["time/step"]
            at_step[row["step"]] = round(clock, 1)
    evaluations = [json.loads(x) for x in (run_dir / EVALUATIONS).read_text().splitlines()]
    return [
        {"step": e["step"], "training_seconds": at_step[e["step"]],
         **{k: v for k, v in e.items() if k.startswith("eval/") and "/rewards/" not in k}}
        for e in evaluations if e.get("overrides", []) == overrides and e["step"] in steps
    ]  # fmt: skip


def config_files(config) -> list[str]:
    """The files of the repository a loaded config trains with: its built-in task's module, the
    `grpo.tasks` modules that one imports (its prompts, the helpers tasks share), and its model
    folder, when they are in the repository."""
    found = []
    task = f"grpo/tasks/{config.task.name}.py"
    for path in (task, *_task_imports(REPO / task), config.model.path):
        try:
            if (REPO / path).resolve().is_relative_to(REPO) and (REPO / path).exists():
                found.append(str(Path(path)))
        except (OSError, ValueError):
            continue
    return found


def _task_imports(file: Path) -> list[str]:
    """The `grpo.tasks` modules `file` imports (the package's own helpers as its __init__.py;
    function-level imports too), as repository paths; [] when `file` is not a file."""
    if not file.is_file():
        return []
    found = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:  # "grpo.tasks.x.NAME" names no file and is skipped
            path = "grpo/tasks/__init__.py" if name == "grpo.tasks" else name.replace(".", "/") + ".py"
            if name.startswith("grpo.tasks") and (REPO / path).is_file():
                found.append(path)
    return list(dict.fromkeys(found))


def main(argv: list[str] | None = None) -> Path:
    from grpo.run.config_files import load_config

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    folder = RESULTS if args.results is None else args.results
    if args.remeasure and not args.add_to:
        raise SystemExit("--remeasure: only with --add-to")
    before, replaced = earlier_runs(args, folder) if args.add_to else ([], [])
    config = load_config(str(REPO / args.config), args.overrides)
    threads = min(config.run.threads or os.cpu_count() or 1, os.cpu_count() or 1)
    runs = []
    for seed in args.seeds:
        run_dir = REPO / args.runs / args.name / f"seed-{seed}"
        run = run_seed(args.config, seed, run_dir, args.overrides, threads, args.settle)
        if args.evaluate_steps:
            run["checkpoint_evaluations"] = evaluate_checkpoints(
                run, args.evaluate_steps, args.evaluate_set
            )
        print(f"seed {seed}: {run['wall_seconds']} s, " + " ".join(run["end_of_output"][1:2]))
        runs.append(run)
    remeasured = []
    if args.add_to:
        stamp = {"commit": _git("rev-parse", "HEAD"), "date": datetime.datetime.now(
            datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine()}  # fmt: skip
        earlier = json.loads((folder / f"{args.name}.json").read_text())
        runs, remeasured = join(before, replaced, [{**stamp, **run} for run in runs],
                                earlier["results"])  # fmt: skip
        argv = command_for(argv, [run["seed"] for run in runs])
        args.depends_on += [p for p in earlier["depends_on_paths"] if p not in args.depends_on]
    depends = list(dict.fromkeys([args.config, *config_files(config), *TRAINING_PATH, *COMMAND_LINE,
                                  *args.depends_on]))  # fmt: skip
    results = {"config": args.config, "overrides": args.overrides,
               "evaluate_overrides": args.evaluate_set,
               "omp_wait_policy": worker_env()["OMP_WAIT_POLICY"], "runs": runs,
               **({"remeasured": remeasured} if remeasured else {})}  # fmt: skip
    path = write_record(args.name, results, depends, argv=["bench/train_seeds.py", *argv],
                        folder=folder)  # fmt: skip
    print(f"record: {path}")
    return path


if __name__ == "__main__":
    main()
