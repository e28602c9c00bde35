"""A step's phases with and without some environment variables, side by side in one sitting.

    python bench/environment_pairs.py --env THP_MEM_ALLOC_ENABLE=1 --set policy.precision=fp32 \
        --record huge_pages_float32

`bench/roofline.py` runs on the config (its untimed warm-up step, then `--steps` timed ones)
in a fresh process each time, in turns: without the variables, with them, `--rounds` pairs,
so that a machine whose speed drifts during the sitting weighs on both alike. "Without" takes
the variables out of the environment; "with" sets them. Each phase's ratio is with over
without, pair by pair, in seconds per completion token sampled (seconds for the optimizer),
as in `bench/step_before_after.py`, whose comparison this reuses.

A variable that changes how the process runs but not what it computes leaves every run
sampling completions of the same lengths, step after step: the record keeps each run's, and
whether they agree (`agreement`). Every run gets the environment the other benchmarks give
their measured processes (`common.worker_env`: OpenMP's waiting threads sleep unless
`OMP_WAIT_POLICY` is set), with the variables set or taken out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import worker_env  # noqa: E402
from records import REPO  # noqa: E402
from step_before_after import RUN_ROOFLINE, _seconds, compare  # noqa: E402

SIDES = ("without", "with")
ROOFLINE_SCRIPTS = ["bench/roofline.py", "bench/roofline_calls.py", "bench/roofline_counts.py",
                    "bench/roofline_memory.py", "bench/roofline_peaks.py"]  # fmt: skip


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE arguments as a dict; a pair without '=' or with an empty key is an error."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/smollm2_math.yaml")
    parser.add_argument("--env", action="append", required=True, metavar="KEY=VALUE",
                        help="a variable set in the 'with' runs and taken out of the others")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as for grpo train")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="without/with pairs")
    parser.add_argument("--steps", type=int, default=2, help="timed steps of each run")
    parser.add_argument("--record", metavar="NAME", help="write bench/results/NAME.json")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: allowed: >= 1")
    args.env = parse_env(args.env)
    return args


def environments(extra: dict[str, str], base: dict[str, str]) -> dict[str, dict[str, str]]:
    """The two sides' environments: `base` without the variables of `extra`, and with them."""
    without = {k: v for k, v in base.items() if k not in extra}
    return {"without": without, "with": {**without, **extra}}


def roofline_with(env: dict[str, str], config: str, steps: int, overrides: Sequence[str]) -> dict:
    """The results of `bench/roofline.py` in a fresh process with the environment `env`."""
    sets = [arg for pair in overrides for arg in ("--set", pair)]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "roofline.json"
        subprocess.run([sys.executable, "-c", RUN_ROOFLINE, str(out), config, "--steps",
                        str(steps), *sets], cwd=REPO, env=env, check=True)  # fmt: skip
        return json.loads(out.read_text())


def _completions(run: dict[str, Any]) -> list[list[float | None]]:
    """Each measured step's completions: their number, mean length and the FLOPs of sampling
    and of the loss phase (which count each completion's own length): equal in two runs when
    they sampled the same lengths, step after step."""
    return [[step["tokens"]["completions"], step["tokens"]["completion_tokens_mean"],
             step["phases"]["sampling"]["flops"], step["phases"]["loss_backward"]["flops"]]
            for step in run["per_step"]]  # fmt: skip


def agreement(completions: dict[str, list]) -> str:
    """"same": every run sampled the same lengths; "sides differ": each side's runs agree among
    themselves and the two sides differ (the variable changed what was computed); "runs
    differ": runs of one side differ (a run is not reproducible, whatever the variable does)."""
    distinct = {side: {json.dumps(c) for c in cs} for side, cs in completions.items()}
    if any(len(d) > 1 for d in distinct.values()):
        return "runs differ"
    return "same" if len(set().union(*distinct.values())) == 1 else "sides differ"


def _peak_rss_gib(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each phase's largest peak RSS over the runs, GiB, by phase; None where no run had one."""
    peaks: dict[str, float | None] = {}
    for run in runs:
        for row in run["phases"]:
            value = row.get("peak_rss_bytes")
            old = peaks.get(row["phase"])
            gib = None if value is None else value / 2**30
            peaks[row["phase"]] = gib if old is None else old if gib is None else max(old, gib)
    return peaks


def measure(args: argparse.Namespace,
            run: Callable[..., dict[str, Any]] = roofline_with) -> dict[str, Any]:  # fmt: skip
    envs = environments(args.env, worker_env())
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            runs[side].append(run(envs[side], args.config, args.steps, args.set))
    phases = compare({"before": runs["without"], "after": runs["with"]})
    for phase in phases.values():
        phase["without"], phase["with"] = phase.pop("before"), phase.pop("after")
    completions = {side: [_completions(r) for r in runs[side]] for side in SIDES}
    dtype = runs["without"][0]["dtypes"]["scoring"]
    return {
        "config": args.config, "overrides": list(args.set), "env": args.env,
        "omp_wait_policy": envs["without"].get("OMP_WAIT_POLICY"),
        "rounds": args.rounds, "steps": args.steps, "phases": phases,
        "peak_rss_gib": {side: _peak_rss_gib(runs[side]) for side in SIDES},
        "completions": completions, "agreement": agreement(completions),
        "flags": {side: [r.get("flags", []) for r in runs[side]] for side in SIDES},
        "peak_dtype": dtype,
        "peaks_gflops": {side: [r["peaks"]["matmul"][dtype]["flops_per_s"] / 1e9
                                for r in runs[side]] for side in SIDES},
    }  # fmt: skip


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(results: dict[str, Any]) -> str:
    lines = ["| phase | without s/step (each run) | with s/step (each run) | with / without "
             "(each pair) | with / without (median) | peak RSS without, with (GiB) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    rss = results["peak_rss_gib"]
    for key, phase in results["phases"].items():
        ratios = ", ".join(f"{x:.2f}" for x in phase["ratios"])
        memory = f"{_gib(rss['without'].get(key))}, {_gib(rss['with'].get(key))}"
        lines.append(f"| {phase['name']} | {_seconds(phase['without'])} | "
                     f"{_seconds(phase['with'])} | {ratios} | {phase['median_ratio']:.2f} | "
                     f"{memory} |")  # fmt: skip
    return "\n".join(lines)


AGREEMENT = {
    "same": "every run sampled completions of the same lengths, step after step (their number, "
            "mean length and the FLOPs counted for them agree): whatever changed was the time, "
            "not, as far as these show, what was computed",
    "sides differ": "the runs of each side sampled the same lengths and the two sides different "
                    "ones: the variable changed what was computed",
    "runs differ": "runs of one side sampled completions of different lengths: a run does not "
                   "repeat itself here, so what the variable changes cannot be read off",
}  # fmt: skip


def note(results: dict[str, Any]) -> str:
    """What the table measured, in one paragraph."""
    env = " ".join(f"{k}={v}" for k, v in results["env"].items())
    sets = "".join(f" --set {s}" for s in results["overrides"])
    peaks = "; ".join(f"{side} " + ", ".join(f"{p:.0f}" for p in ps)
                      for side, ps in results["peaks_gflops"].items())  # fmt: skip
    flagged = sorted({f for runs in results["flags"].values() for flags in runs for f in flags})
    flags = (f" `bench/roofline.py` flagged the timing of some runs ({'; '.join(flagged)}); "
             "run back to back, each run reads a load average its predecessor raised."
             if flagged else "")  # fmt: skip
    return (
        f"`bench/roofline.py {results['config']}{sets}` in turns without and with `{env}`, "
        f"{results['rounds']} of each, each in a fresh process (OMP_WAIT_POLICY="
        f"{results['omp_wait_policy']}): one untimed step, then the mean of {results['steps']} "
        f"steps; {AGREEMENT[results['agreement']]}. The ratio is of seconds per completion "
        "token sampled (of seconds for the optimizer): below 1, the phase was faster with the "
        "variable. Peak RSS is the largest of the runs'. The "
        f"{results['peak_dtype']} matrix-product peak each run measured (GFLOP/s), a gauge of "
        f"the machine's speed during it: {peaks}.{flags}"
    )


def main(argv: Sequence[str] | None = None, folder: Path | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = measure(args)
    from provenance import table_and_note

    print(table_and_note(table, note, results))
    if args.record:
        from records import RESULTS, write_config_record

        scripts = ["bench/environment_pairs.py", "bench/step_before_after.py", *ROOFLINE_SCRIPTS]
        write_config_record(args.record, results, args.config, scripts, argv, folder or RESULTS)
    return results


if __name__ == "__main__":
    main()
