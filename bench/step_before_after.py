"""A step's phases at two commits, side by side in one sitting: what a change gained.

    python bench/step_before_after.py --before 55b6b31 --record step_before_after
    python bench/step_before_after.py configs/gemma3_math.yaml --before REV --after REV

Each commit is checked out in a temporary git worktree, and that commit's `bench/roofline.py`
runs in it on the config (its untimed warm-up step, then `--steps` timed ones), in turns:
before, after, before, after (`--rounds` pairs), so that a machine whose speed drifts during
the sitting weighs on both alike. Each commit's run samples its own completions (a change of
rounding changes what is drawn), so their lengths differ a little between them: the ratio
compares seconds per completion token sampled (seconds for the optimizer, whose work is the
same), pair by pair, with the median of the pairs. Not per FLOP counted: a change that stops
computing padding lowers the count it is measured by. Both commits need `bench/roofline.py`
with this command line, and the model folders the config names.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import REPO  # noqa: E402

RUN_ROOFLINE = (
    "import json, sys; sys.path.insert(0, 'bench'); import roofline; "
    "json.dump(roofline.main(sys.argv[2:]), open(sys.argv[1], 'w'))"
)
PHASES = ("sampling", "loss_backward", "optimizer", "total")


def git(*args: str) -> str:
    """git's output in the repository; a failure raises with git's own message."""
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/smollm2_math.yaml")
    parser.add_argument("--before", required=True, help="the commit measured first")
    parser.add_argument("--after", default="HEAD", help="the commit measured second")
    parser.add_argument("--rounds", type=int, default=2, help="before/after pairs")
    parser.add_argument("--steps", type=int, default=3, help="timed steps of each run")
    parser.add_argument("--record", metavar="NAME", help="write bench/results/NAME.json")
    return parser.parse_args(argv)


def roofline_in(tree: Path, config: str, steps: int) -> dict[str, Any]:
    """The results of `bench/roofline.py` run in the checkout `tree` (its code imported)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "roofline.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-c", RUN_ROOFLINE, str(out), config, "--steps",
                        str(steps)], cwd=tree, env=env, check=True)  # fmt: skip
        return json.loads(out.read_text())


def phase_rows(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A roofline's phases by key: name, seconds and GFLOP a step (None where not counted),
    and the completion tokens sampled a step."""
    tokens = results["tokens_per_step"]
    sampled = tokens["completions"] * tokens["completion_tokens_mean"]
    rows = {}
    for r in results["phases"]:
        flops = r.get("flops")
        rows[r["phase"]] = {"name": r["name"], "seconds": r["seconds"], "tokens": sampled,
                            "gflop": None if flops is None else flops / 1e9}  # fmt: skip
    return rows


def pair_ratio(before: dict[str, Any], after: dict[str, Any], key: str) -> float:
    """After over before of one phase: seconds per completion token sampled, or seconds for
    the optimizer (whose work does not depend on the tokens)."""
    if key == "optimizer":
        return after["seconds"] / before["seconds"]
    return (after["seconds"] / after["tokens"]) / (before["seconds"] / before["tokens"])


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per phase: each run's seconds and GFLOP, each pair's ratio and their median."""
    rows = {side: [phase_rows(r) for r in side_runs] for side, side_runs in runs.items()}
    phases = {}
    for key in PHASES:
        before = [r[key] for r in rows["before"] if key in r]
        after = [r[key] for r in rows["after"] if key in r]
        if not before or len(before) != len(after):
            continue
        ratios = [pair_ratio(b, a, key) for b, a in zip(before, after, strict=True)]
        phases[key] = {"name": before[0]["name"], "before": before, "after": after,
                       "ratios": ratios, "median_ratio": statistics.median(ratios)}  # fmt: skip
    return phases


def measure(args: argparse.Namespace,
            run: Callable[[Path, str, int], dict[str, Any]] = roofline_in) -> dict[str, Any]:  # fmt: skip
    commits = {side: git("rev-parse", "--verify", f"{getattr(args, side)}^{{commit}}")
               for side in ("before", "after")}  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as scratch:
        trees = {side: Path(scratch) / side for side in commits}
        try:
            for side, commit in commits.items():
                git("worktree", "add", "--detach", str(trees[side]), commit)
            for _ in range(args.rounds):
                for side in ("before", "after"):
                    runs[side].append(run(trees[side], args.config, args.steps))
        finally:
            for tree in trees.values():
                if tree.exists():
                    git("worktree", "remove", "--force", str(tree))
    return {"config": args.config, "commits": commits, "rounds": args.rounds,
            "steps": args.steps, "phases": compare(runs),
            "peaks_bf16_gflops": {side: [r["peaks"]["matmul"]["bfloat16"]["flops_per_s"] / 1e9
                                         for r in rs] for side, rs in runs.items()}}  # fmt: skip


def _seconds(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['seconds']:.2f}" for r in rows)


def table(results: dict[str, Any]) -> str:
    lines = ["| phase | before s/step (each run) | after s/step (each run) | completion tokens "
             "a step, before, after (first run) | GFLOP/step before, after (first run) | "
             "after / before (each pair) | after / before (median) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for phase in results["phases"].values():
        b, a = phase["before"][0]["gflop"], phase["after"][0]["gflop"]
        work = "-" if b is None or a is None else f"{b:.0f}, {a:.0f}"
        tokens = f"{phase['before'][0]['tokens']:.0f}, {phase['after'][0]['tokens']:.0f}"
        ratios = ", ".join(f"{x:.2f}" for x in phase["ratios"])
        lines.append(f"| {phase['name']} | {_seconds(phase['before'])} | "
                     f"{_seconds(phase['after'])} | {tokens} | {work} | {ratios} | "
                     f"{phase['median_ratio']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def note(results: dict[str, Any]) -> str:
    """What the table measured, in one paragraph."""
    commits = results["commits"]
    peaks = "; ".join(f"{side} " + ", ".join(f"{p:.0f}" for p in ps)
                      for side, ps in results["peaks_bf16_gflops"].items())  # fmt: skip
    return (
        f"`bench/roofline.py {results['config']}` at commit {commits['before'][:7]} (before) "
        f"and {commits['after'][:7]} (after), each in its own checkout, in turns (before, "
        f"after), {results['rounds']} of each; each run one untimed step, then the mean of "
        f"{results['steps']} steps. Each run samples its own completions, so the ratio is of "
        "seconds per completion token sampled (of seconds for the optimizer): below 1, the "
        "after commit is faster. GFLOP counts the work each phase ran, padding included. The bfloat16 matrix-product peak each run measured "
        f"(GFLOP/s), a gauge of the machine's speed at the time: {peaks}."
    )


def main(argv: Sequence[str] | None = None, folder: Path | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = measure(args)
    from provenance import table_and_note

    print(table_and_note(table, note, results))
    if args.record:
        from records import RESULTS, write_script_record

        script = "bench/step_before_after.py"
        write_script_record(args.record, results, [script], script, argv, folder or RESULTS)
    return results


if __name__ == "__main__":
    main()
