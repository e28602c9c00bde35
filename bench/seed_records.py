"""Joining seeds to a `bench/train_seeds.py` record measured earlier: `--add-to` and `--remeasure`.

`--add-to` adds new seeds to record NAME: only with its config, overrides and evaluations,
none of its seeds, and none of its files changed since (`records.stale`); each run keeps the
commit, date and machine it was measured at.

`--add-to --remeasure` measures seeds the record already holds again, on the CPU they were
measured on: for their timing, say, when the first run shared the machine. Training and
evaluation here are deterministic on one machine, so the new run must reproduce every held-out
evaluation and every training mean of the old one; it then replaces it, and the record keeps
what the old run measured of time (`remeasured`), which the pages name. Any difference
refuses the replacement and leaves the record as it was.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from provenance import stamped_runs
from records import machine, stale

__all__ = ["TIMING_KEYS", "command_for", "earlier_runs", "join", "same_numbers"]

TIMING_KEYS = ("wall_seconds", "cpu_seconds", "peak_rss_gib", "load_before", "flags",
               "training_seconds", "median_step_seconds")  # fmt: skip
"""A run's keys that measure time and resources, not what training computed."""


def earlier_runs(args: argparse.Namespace, folder: Path) -> tuple[list[dict], list[dict]]:
    """(the runs of record `args.name` that stay, the runs `--remeasure` replaces), each
    stamped with the commit, date and machine it was measured at; a SystemExit says why the
    seeds cannot be joined."""
    path = folder / f"{args.name}.json"
    if not path.is_file():
        raise SystemExit(f"--add-to: no record {path}")
    record = json.loads(path.read_text())
    r = record["results"]
    same = (r["config"], r["overrides"], r["evaluate_overrides"]) == (
        args.config, args.overrides, args.evaluate_set)
    if not same or sorted({e for run in r["runs"] for e in _steps_evaluated(run)}) != sorted(
            args.evaluate_steps):
        raise SystemExit(f"--add-to: {args.name} was measured with other settings: "
                         f"{record['command']}")  # fmt: skip
    held = {run["seed"] for run in r["runs"]}
    if args.remeasure and not set(args.seeds) <= held:
        raise SystemExit(f"--remeasure: {args.name} holds seeds {sorted(held)}, "
                         f"not {sorted(set(args.seeds) - held)}")  # fmt: skip
    if not args.remeasure and set(args.seeds) & held:
        raise SystemExit(f"--add-to: {args.name} already holds seeds {sorted(held)}")
    changed = stale(record)
    if changed:
        raise SystemExit(f"--add-to: {', '.join(changed)} changed since {args.name} was "
                         "measured; measure every seed again")  # fmt: skip
    stamped = stamped_runs(record)
    old = [run for run in stamped if args.remeasure and run["seed"] in args.seeds]
    here = machine()["cpu"]
    elsewhere = [run["seed"] for run in old if run["machine"]["cpu"] != here]
    if elsewhere:
        raise SystemExit(f"--remeasure: seeds {elsewhere} were measured on another CPU, which "
                         "rounds otherwise; add new seeds instead")  # fmt: skip
    return [run for run in stamped if run not in old], old


def _steps_evaluated(run: dict) -> list[int]:
    return [e["step"] for e in run.get("checkpoint_evaluations", [])]


def _numbers(run: dict) -> dict:
    """What a run computed: its training means and held-out evaluations, without times."""
    def untimed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "training_seconds"} for row in rows]

    return {"steps": run["steps"], "training": run["training"],
            "evaluations": untimed(run["evaluations"]),
            "checkpoint_evaluations": untimed(run.get("checkpoint_evaluations", []))}  # fmt: skip


def same_numbers(old: dict, new: dict) -> list[str]:
    """The parts of `_numbers` in which run `new` differs from run `old` ([] = none)."""
    a, b = _numbers(old), _numbers(new)
    return [key for key in a if a[key] != b[key]]


def join(kept: list[dict], old: list[dict], new: list[dict], earlier: dict) -> tuple[list, list]:
    """(every run, by seed; the record's `remeasured` list): `new` runs (stamped) replace the
    `old` runs of their seeds only where they computed the same numbers; `earlier` is the
    record's results as they were."""
    by_seed = {run["seed"]: run for run in old}
    for run in new:
        if run["seed"] in by_seed:
            differ = same_numbers(by_seed[run["seed"]], run)
            if differ:
                raise SystemExit(f"--remeasure: seed {run['seed']} computed other "
                                 f"{', '.join(differ)} than its record; the record is left "
                                 "as it was (measure every seed again)")  # fmt: skip
    replaced = [{"seed": run["seed"], "commit": run["commit"], "date": run["date"],
                 **{k: run[k] for k in TIMING_KEYS if k in run}} for run in old]  # fmt: skip
    runs = sorted(kept + new, key=lambda run: run["seed"])
    return runs, earlier.get("remeasured", []) + replaced


def command_for(argv: list[str], seeds: list[int]) -> list[str]:
    """`argv` as one invocation that measures every seed of the record."""
    out, skip = [], False
    for arg in argv:
        if skip and not arg.startswith("--"):
            continue
        skip = arg == "--seeds"
        if arg in ("--add-to", "--remeasure"):
            continue
        out += [arg, *map(str, seeds)] if skip else [arg]
    return out if "--seeds" in argv else [*out, "--seeds", *map(str, seeds)]
