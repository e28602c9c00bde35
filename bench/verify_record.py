"""Show that a stale training record still stands, by replaying its start at the current commit.

    python bench/verify_record.py chess                 # the first seed's first tenth of steps
    python bench/verify_record.py smollm2_math --seed 0 --steps 4
    python bench/verify_record.py demo_vs_trl          # grpo's seed 0 to its second evaluation

A record of `bench/train_seeds.py` turns stale when any file of the training path changes
(`records.stale`), also when the change cannot touch its numbers (a new option that defaults
to the old behaviour). Training here is deterministic on one machine: the same code, seed and
threads give the same numbers to the last bit. This script runs the record's command for one
seed (the same config and overrides, a scratch run directory) until its first `--steps` steps
are logged (default: the first tenth, the span the record's "first" training means cover),
stops it, and compares:
- the held-out evaluation the run made at step 0, every `eval/` value exactly;
- the mean over those steps of each training metric the record summarises, to the record's
  six decimals (only when the replay covers exactly the record's first tenth).
A record of `bench/time_to_accuracy.py` (grpo against TRL) replays grpo's run of the seed
(default 0) to its second evaluation and compares every figure of its first two points
exactly (their times excluded); TRL's runs are not replayed: they run no code of this
repository's training path but its tasks, data and rewards, which grpo's replay runs too.
All equal: the record's digests are rewritten for the current files and a `verified` entry
(commit, date, seed, steps, values compared) is added, which `bench/render_results.py`
prints beside the record's own command. Any difference: the values are listed, the record
is left stale and the script exits 1: measure again. The files the record depends on must be
committed (a replay of uncommitted code proves nothing about a commit).

The replay shows that the code changed since the measurement computes the same start; it does
not replay the whole run. The rendered line says so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_seeds  # noqa: E402
from common import worker_env  # noqa: E402
from records import REPO, RESULTS, _git, file_hashes, lacking_paths, machine, stale  # noqa: E402


def replay(record: dict, seed: int, steps: int, run_dir: Path, root: Path = REPO,
           timeout: float = 3600.0) -> list[dict]:  # fmt: skip
    """The metric rows of the record's command for `seed`, stopped once each training metric
    the record summarises is logged `steps` times (a metric can be missing from a step, as
    the losses from the first) and at least `steps` steps ran."""
    keys = next(iter(record["results"]["runs"]))["training"].keys()
    args = train_seeds.parse_args(shlex.split(record["command"])[2:])
    cmd = [sys.executable, "-m", "grpo", "train", args.config, "--set", f"seed={seed}",
           "--set", f"run.dir={run_dir}"] + [a for o in args.overrides for a in ("--set", o)]  # fmt: skip
    metrics, log = run_dir / "metrics.jsonl", run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:  # a file, not a pipe: a full pipe would stop the run
        proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=_env(root))  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            while True:
                exited = proc.poll() is not None  # before reading: its last rows are written
                rows = _rows(metrics)
                step_rows = [row for row in rows if "time/step" in row]
                if len(step_rows) >= steps and all(
                        sum(key in row for row in step_rows) >= steps for key in keys):
                    break
                if exited:
                    raise SystemExit(f"seed {seed}: grpo train ended (status {proc.returncode}) "
                                     f"with fewer than {steps} values of {sorted(keys)}:\n"
                                     f"{log.read_text()[-3000:]}")  # fmt: skip
                if time.monotonic() > deadline:
                    raise SystemExit(f"seed {seed}: {steps} steps not logged within {timeout:.0f} s")
                time.sleep(1.0)
        finally:
            proc.kill()
            proc.wait()
    return rows


def _rows(metrics: Path) -> list[dict]:
    """The complete lines of a metrics file being written."""
    if not metrics.is_file():
        return []
    lines = metrics.read_text().split("\n")[:-1]  # the last piece may be half a line
    return [json.loads(line) for line in lines if line]


def compare(run: dict, rows: list[dict], steps: int) -> tuple[int, list[str]]:
    """How many values the replay's `rows` were compared on against the record's `run`, and
    each difference as "name: recorded -> replayed"."""
    differences, compared = [], 0
    recorded = next((e for e in run["evaluations"] if e["step"] == 0), None)
    replayed = next((e for e in train_seeds._evaluations(rows) if e["step"] == 0), None)
    if recorded is not None:
        if replayed is None:
            return 0, ["the replay made no step-0 evaluation; the record has one"]
        for key in sorted(k for k in recorded if k.startswith("eval/")):
            compared += 1
            if replayed.get(key) != recorded[key]:
                differences.append(f"{key}: {recorded[key]} -> {replayed.get(key)}")
    if steps == max(1, run["steps"] // 10):
        means = _first_means(rows, run["training"], steps)
        for key, summary in run["training"].items():
            compared += 1
            got = means[key]
            if got != summary["first"]:
                differences.append(
                    f"{key} (mean of its first {steps} values): {summary['first']} -> {got}")
    return compared, differences


def replay_curve(record: dict, seed: int, root: Path = REPO) -> tuple[list[dict], list[dict]]:
    """A `bench/time_to_accuracy.py` record: grpo's run of `seed` replayed (this repository's
    worker, the `grpo` package of `root`) to its second evaluation, the schedule unchanged;
    (the recorded points, the replayed points). TRL's runs are not replayed."""
    import time_to_accuracy

    r = record["results"]
    args = time_to_accuracy.parse_args(shlex.split(record["command"])[2:])
    runs = [x for x in r["records"] if x["library"] == "grpo" and int(x["seed"]) == seed]
    if not runs:
        raise SystemExit(f"{record['name']}: no grpo run of seed {seed}")
    recorded = runs[0]["points"][:2]
    overrides = [*r["overrides"], *r["per_library"]["grpo"], f"until={recorded[-1]['step']}"]
    with tempfile.TemporaryDirectory(prefix=f"verify-{record['name']}-") as out:
        done = subprocess.run([sys.executable, str(time_to_accuracy.WORKER), "grpo", str(seed),
                               str(args.eval_every), out, *overrides], capture_output=True,
                              text=True, cwd=root, env=_env(root))  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{record['name']}: the replay failed:\n{done.stderr[-3000:]}")
    return recorded, json.loads(done.stdout.strip().splitlines()[-1])["points"]


def compare_points(recorded: list[dict], replayed: list[dict]) -> tuple[int, list[str]]:
    """Every figure of the recorded evaluation points against the replayed ones (times
    excluded): (values compared, differences)."""
    timing = {"seconds", "cpu_seconds", "sampling_seconds"}
    compared, differences = 0, []
    for want, got in zip(recorded, replayed, strict=False):
        for key in sorted(set(want) - timing):
            compared += 1
            if got.get(key) != want[key]:
                differences.append(f"step {want['step']} {key}: {want[key]} -> {got.get(key)}")
    if len(replayed) < len(recorded):
        differences.append(f"the replay made {len(replayed)} evaluations, not {len(recorded)}")
    return compared, differences


def _env(root: Path) -> dict[str, str]:
    """A replay's environment: `worker_env`, importing `grpo` from `root`."""
    return {**worker_env(), "PYTHONPATH": str(root)}


def _as_run(run: dict, rows: list[dict], steps: int) -> dict:
    """A replay's rows in the shape of a record's run, for `compare`: its step-0 evaluation
    and the means `compare` takes of the training metrics of `run`."""
    training = {key: {"first": mean} for key, mean in _first_means(rows, run["training"], steps).items()}
    return {"steps": run["steps"], "evaluations": train_seeds._evaluations(rows),
            "training": training}  # fmt: skip


def _first_means(rows: list[dict], keys, steps: int) -> dict[str, float | None]:
    """Each metric's mean over the first `steps` step rows that log it, rounded as
    `train_seeds.training_summary` rounds ("first"); None where no row logs it."""
    step_rows = [row for row in rows if "time/step" in row]
    means = {}
    for key in keys:
        values = [row[key] for row in step_rows if key in row][:steps]
        means[key] = round(statistics.fmean(values), 6) if values else None
    return means


@contextlib.contextmanager
def checkout(commit: str):
    """A temporary worktree of `commit` (the code a record was measured with)."""
    with tempfile.TemporaryDirectory(prefix="verify-checkout-") as parent:
        tree = Path(parent) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO,
                       check=True, capture_output=True)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO,
                           check=False, capture_output=True)  # fmt: skip


def other_machine(record: dict) -> bool:
    """Whether `record` was measured on another kind of CPU (its arithmetic may round
    otherwise: a replay here cannot give its numbers to the last bit)."""
    here = machine()
    return (record["machine"]["cpu"], record["machine"]["flags"]) != (here["cpu"], here["flags"])


def verify(name: str, seed: int | None = None, steps: int | None = None,
           folder: Path = RESULTS) -> bool:  # fmt: skip
    """Replay record `name`'s start; on a match rewrite its digests and add `verified`."""
    path = folder / f"{name}.json"
    record = json.loads(path.read_text())
    curve = "bench/time_to_accuracy.py" in record["command"]
    if curve and "--grpo-run" in record["command"]:
        raise SystemExit(f"{name}: grpo's side was read from runs of bench/train_seeds.py; "
                         "verify their record, and measure TRL's side again with: "
                         f"{record['command']}")  # fmt: skip
    if "bench/train_seeds.py" not in record["command"] and not curve:
        raise SystemExit(f"{name}: only records of bench/train_seeds.py and "
                         "bench/time_to_accuracy.py can be replayed; measure it again with: "
                         f"{record['command']}")  # fmt: skip
    # the replay runs today's whole training path: its digests cover every file of it
    paths = [*record["depends_on_paths"], *lacking_paths(record)]
    dirty = _git("status", "--porcelain", "--", *paths)
    if dirty:
        raise SystemExit(f"{name}: commit these files first:\n{dirty}")
    differential = other_machine(record)
    commit = record["commit"]
    if curve:
        seed = 0 if seed is None else seed
        recorded, now = replay_curve(record, seed)
        steps = recorded[-1]["step"]
        if differential:  # the record's code replayed here stands in for the record
            with checkout(record["commit"]) as tree:
                _, recorded = replay_curve(record, seed, tree)
        compared, differences = compare_points(recorded, now)
        scope = f"grpo's run of seed {seed}, to its evaluation at step {steps}"
    else:
        runs = {run["seed"]: run for run in record["results"]["runs"]}
        seed = next(iter(runs)) if seed is None else seed
        if seed not in runs:
            raise SystemExit(f"{name}: --seed {seed} not in the record; it has {sorted(runs)}")
        run = runs[seed]
        commit = run.get("commit", record["commit"])  # a seed added later (--add-to)
        differential = other_machine({**record, **({"machine": run["machine"]}
                                                   if "machine" in run else {})})  # fmt: skip
        steps = steps or max(1, run["steps"] // 10)
        with tempfile.TemporaryDirectory(prefix=f"verify-{name}-") as scratch:
            rows = replay(record, seed, steps, Path(scratch) / "run")
            if differential:
                with checkout(commit) as tree:
                    run = _as_run(run, replay(record, seed, steps, Path(scratch) / "old", tree),
                                  steps)  # fmt: skip
        compared, differences = compare(run, rows, steps)
        scope = f"seed {seed}'s first {steps} steps and its step-0 evaluation"
    if differences or not compared:
        print(f"{name}: the replay differs ({compared} values compared):")
        print("\n".join(f"  {d}" for d in differences) or "  nothing to compare")
        return False
    changed = stale(record)
    record["depends_on_paths"] = paths
    record["depends_on"] = file_hashes(paths, REPO, "meaning")
    record["hashing"] = "meaning"
    record.setdefault("verified", []).append({
        "commit": _git("rev-parse", "HEAD"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seed": seed, "steps": steps, "values": compared, "scope": scope, "changed": changed,
        # on another machine: this commit's replay against the measured commit's, both here
        "against": {"commit": commit, "cpu": machine()["cpu"]} if differential else "record",
    })  # fmt: skip
    path.write_text(json.dumps(record, indent=1) + "\n")
    against = "the measured commit's replay here" if differential else "the recorded numbers"
    print(f"{name}: {scope} replay to {against} ({compared} values); digests rewritten for "
          f"{len(changed)} changed files")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="records in bench/results/")
    parser.add_argument("--seed", type=int, default=None, help="default: the record's first")
    parser.add_argument("--steps", type=int, default=None,
                        help="default: the first tenth of the record's steps")
    args = parser.parse_args(argv)
    ok = [verify(name, args.seed, args.steps) for name in args.names]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
