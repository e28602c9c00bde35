"""Held-out accuracy against training wall time: grpo and TRL 1.16 on the same workload.

    python bench/time_to_accuracy.py                      # demo workload, 3 seeds each
    python bench/time_to_accuracy.py --workload minus     # + and -: a harder task
    python bench/time_to_accuracy.py --seeds 1 --steps 40 --eval-every 10   # a quick look
    python bench/time_to_accuracy.py --trl-steps 500    # each library's own schedule length
    python bench/time_to_accuracy.py --workload smollm2 --seeds 1 --eval-every 8
    python bench/time_to_accuracy.py --workload smollm2 --libraries trl --trl-steps 20 \
        --eval-every 10 --grpo-run runs/smollm2_math   # grpo's curve from a `grpo train` run
    python bench/time_to_accuracy.py --workload chess --eval-every 100 --record chess_vs_trl
    python bench/time_to_accuracy.py --workload gemma3 --seeds 1 --steps 2 --eval-every 1 \\
        --set task.eval_size=10   # a quick look at the base-model workload

The gemma3 workload is configs/gemma3_math.yaml (`grpo fetch gemma3-270m --accept-license
gemma` first): a base model asked word problems as plain "Question: ...\\nAnswer:" text,
generation ending at "\\nQuestion:", its tied embedding frozen (`model.freeze`). TRL gets
the same str prompts (no chat template), the same stop string (which TRL 1.16 has no
setting for: `bench/trl_stops.py`), the same frozen parameters, precision and settings;
where it still differs is listed in `bench/accuracy_workers.py`. grpo's three seeds come
from the runs of `bench/train_seeds.py` that made the record `gemma3_math` (evaluated at steps
0, 32 and 64 on the three held-out splits of 200 problems). TRL runs one seed of the same
constant-rate schedule for 8 steps, evaluated at steps 0 and 8: a TRL step takes minutes
here, and 8 of them train longer than grpo's 64 do (the record has both times):

    python bench/time_to_accuracy.py --workload gemma3 --libraries trl --seeds 1 \\
        --trl-steps 8 --eval-every 8 --grpo-run runs/bench/gemma3_math/seed-0 \\
        --grpo-run runs/bench/gemma3_math/seed-1 --grpo-run runs/bench/gemma3_math/seed-2 \\
        --record gemma3_vs_trl

The chess workload compares held-out greedy reward rather than accuracy (the task has
none): "accuracy" below then means that reward. `--record NAME` writes the records and
the summary as bench/results/NAME.json (`bench/records.py`), for `bench/render_results.py`.

`--steps` sets both libraries' schedule (`schedule.num_steps`; default: the
demo's); `--grpo-steps` and `--trl-steps` set one library's, so each can run
the schedule it would be given for the same wall-time budget.

Every run is a fresh subprocess (`bench/accuracy_workers.py`, with `common.worker_env`), alternating
grpo, TRL, grpo, TRL, ... so that both see the same machine state. Each run
records held-out greedy accuracy on the 500 held-out problems every
`--eval-every` steps, against the training wall time so far (evaluations
excluded) and the step. The summary, medians over seeds:
- each library's final accuracy and seconds per step;
- how long each takes to first reach TRL's final (median) accuracy, and grpo's
  time to it over TRL's whole training run (the figure to quote);
- each library's accuracy after equal training wall time (a quarter, half and
  all of TRL's training time).
Each record also keeps the sampler's seconds (grpo's `time/sampling`; TRL's calls to
`generate`) and the process's peak RSS (TRL's includes the copy of its weights the
evaluator scores with). It prints the table, writes the records as JSON (`--json`) and a PNG of
accuracy against seconds with every run and both libraries' medians (`--png`).

Each record also holds the machine's 1-minute load average just before the run
(`load_before`), the run's CPU time over its training spans (`cpu_seconds` of
the last point) and its torch threads; the table flags a run whose load
average exceeded half the cores or whose CPU time fell under 0.8 x wall x
threads (`common.timing_flags`; one thread where waiting threads sleep,
`common.busy_threads`): its timing shared the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_workers import EXTRA, headline  # noqa: E402
from common import busy_threads, load_average, timing_flags, worker_env  # noqa: E402
from records import TRAINING_PATH, write_record  # noqa: E402
from train_seeds import config_files  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "accuracy_workers.py"
WORKLOADS = {  # name -> overrides (of configs/demo.yaml, or of the config=FILE they name first)
    "demo": [],
    # + and -: the warm start has never seen "-" (15 % held-out greedy accuracy against
    # 31 % on the demo). Three operands would be harder still, but the warm start gets
    # about 1 % of them right: too few groups with any signal for either library.
    "minus": ['task.options.operators=["+", "-"]'],
    # word problems on SmolLM2-135M-Instruct (`grpo fetch smollm2` first): accuracy is the
    # greedy accuracy pooled over the held-out splits; each split's is recorded too
    "smollm2": ["config=configs/smollm2_math.yaml"],
    # the same word problems on Gemma 3 270M, a base model (`grpo fetch gemma3-270m`): plain
    # "Question: ... Answer:" prompts, generation ending at "\nQuestion:", the embedding frozen
    "gemma3": ["config=configs/gemma3_math.yaml"],
    # the chess loop's task on the shipped chess-tiny model (beta 0.1, temperature 0.5, top_p 0.9):
    # compared on held-out greedy reward
    "chess": ["config=configs/chess.yaml"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="demo")
    parser.add_argument("--seeds", type=int, default=3, help="runs per library (seeds 0, 1, ...)")
    parser.add_argument("--steps", type=int, default=None, help="override schedule.num_steps")
    parser.add_argument("--grpo-steps", type=int, default=None, help="grpo's schedule.num_steps")
    parser.add_argument("--trl-steps", type=int, default=None, help="TRL's schedule.num_steps")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--set", action="append", default=[], help="more demo.yaml overrides")
    parser.add_argument("--libraries", default="grpo,trl")
    parser.add_argument("--grpo-run", action="append", default=[], metavar="DIR",
                        help="a `grpo train` run directory of the same workload (one per seed): "
                        "its evaluations are grpo's record, and no grpo run is started")
    parser.add_argument("--json", help="write every record and the summary here")
    parser.add_argument("--record", metavar="NAME",
                        help="also write them as the result record bench/results/NAME.json")
    parser.add_argument("--png", help="write the accuracy-against-seconds plot here")
    return parser.parse_args(argv)


def run(library: str, seed: int, args: argparse.Namespace, overrides: list[str]) -> dict:
    load = load_average()
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, str(WORKER), library, str(seed), str(args.eval_every), out]
        done = subprocess.run(command + overrides, capture_output=True, text=True, cwd=REPO,
                              env=worker_env())  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{library} seed {seed} failed:\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    busy = busy_threads(record["threads"], worker_env())
    return {**record, "load_before": load, "cores": os.cpu_count(), "busy_threads": busy}


def record_of_run(run_dir: str) -> dict:
    """A `grpo train` run directory as a worker's record: each evaluation with the training
    and sampling seconds before it (`time/step` and `time/sampling` summed by
    `bench/run_curve.py`) and the run's peak RSS. It has no load average or CPU time: no timing flags."""
    import yaml
    from run_curve import read

    steps, evaluations = read(Path(run_dir))
    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    key = headline(config.get("task", {}).get("name", "arithmetic"))
    points = [
        {"step": e["step"], "seconds": e["seconds"], "accuracy": e[key],
         "sampling_seconds": e["sampling_seconds"],
         **{k.split("/", 1)[1]: e[k] for k in EXTRA if k in e}}
        for e in evaluations
    ]  # fmt: skip
    peak = max((row.get("memory/peak_rss_gib", 0.0) for row in steps), default=0.0)
    return {"library": "grpo", "seed": config.get("seed", 0), "threads": config["run"]["threads"],
            "peak_rss_gib": peak, "source": str(run_dir), "points": points}  # fmt: skip


def run_flags(record: dict) -> list[str]:
    """`timing_flags` of one record ([] for a record without the measurements)."""
    last = record["points"][-1]
    if "load_before" not in record or "cpu_seconds" not in last:
        return []
    return timing_flags(
        record["load_before"], last["cpu_seconds"], last["seconds"],
        record.get("busy_threads", record["threads"]),
        record["cores"],
    )  # fmt: skip


def accuracy_at(points: list[dict], seconds: float) -> float:
    """The accuracy of the last evaluation at or before `seconds` of training."""
    return [p["accuracy"] for p in points if p["seconds"] <= seconds + 1e-9][-1]


def time_to(points: list[dict], accuracy: float) -> float:
    """Training seconds until the first evaluation at or above `accuracy` (inf: never)."""
    return next((p["seconds"] for p in points if p["accuracy"] >= accuracy - 1e-9), float("inf"))


def summarise(records: list[dict]) -> dict:
    by = {lib: [r["points"] for r in records if r["library"] == lib] for lib in ("grpo", "trl")}
    med = statistics.median
    summary = {}
    for lib, runs in by.items():
        flagged = [
            f"seed {r['seed']}: {', '.join(run_flags(r))}"
            for r in records
            if r["library"] == lib and run_flags(r)
        ]
        if runs:
            steps = runs[0][-1]["step"]
            finals = [p[-1]["accuracy"] for p in runs]
            summary[lib] = {
                "steps": steps,
                "final_accuracy": med(finals),
                "final_mean": statistics.fmean(finals),
                "final_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                "seconds": med(p[-1]["seconds"] for p in runs),
                "seconds_per_step": med(p[-1]["seconds"] / steps for p in runs),
                # where recorded: the sampler's share of a step, and the process's peak memory
                "sampling_per_step": med(p[-1].get("sampling_seconds", float("nan")) / steps
                                         for p in runs),  # fmt: skip
                "peak_rss_gib": med(r.get("peak_rss_gib", float("nan")) for r in records
                                    if r["library"] == lib),  # fmt: skip
                "finals": finals,
                "flagged": flagged,
            }
    if by["grpo"] and by["trl"]:
        target, trl_time = summary["trl"]["final_accuracy"], summary["trl"]["seconds"]
        for lib, runs in by.items():
            summary[lib]["time_to_trl_final"] = med(time_to(p, target) for p in runs)
            summary[lib]["accuracy_at"] = {
                f"{frac:g}": med(accuracy_at(p, frac * trl_time) for p in runs)
                for frac in (0.25, 0.5, 1.0)
            }
        summary["trl_start"] = med(p[0]["accuracy"] for p in by["trl"])
        # peak memory as a ratio of the medians (TRL's includes its evaluator's copy of the model)
        summary["ratio_peak_rss"] = summary["grpo"]["peak_rss_gib"] / summary["trl"]["peak_rss_gib"]
        if target <= summary["trl_start"] + 1e-9:
            # TRL ended no higher than it started: both "reach" it at 0 s, no ratio to quote
            summary["ratio_time_to_trl_final"] = summary["ratio_to_trl_run"] = None
        else:
            summary["ratio_time_to_trl_final"] = (
                summary["grpo"]["time_to_trl_final"] / summary["trl"]["time_to_trl_final"]
            )
            # the figure to quote: grpo's time to TRL's final accuracy over TRL's whole run
            summary["ratio_to_trl_run"] = summary["grpo"]["time_to_trl_final"] / trl_time
    return summary


def table(summary: dict) -> str:
    rows = ["| | steps | final accuracy, median (per seed; mean ± sd) | s/step (sampling) | "
            "training s | time to TRL's final | accuracy at 1/4, 1/2, 1 x TRL's time | "
            "peak RSS GiB | flagged runs |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for lib in ("grpo", "trl"):
        if lib not in summary:
            continue
        s = summary[lib]
        finals = ", ".join(f"{100 * a:.1f}" for a in s["finals"])
        at = s.get("accuracy_at", {})
        at_text = " / ".join(f"{100 * at[k]:.1f}" for k in ("0.25", "0.5", "1")) if at else "-"
        ttf = s.get("time_to_trl_final")
        rows.append(
            f"| {lib} | {s['steps']} | {100 * s['final_accuracy']:.1f} % ({finals}; "
            f"{100 * s['final_mean']:.1f} ± {100 * s['final_sd']:.1f}) | {s['seconds_per_step']:.3f} "
            f"({s['sampling_per_step']:.3f}) | {s['seconds']:.0f} "
            f"| {'-' if ttf is None else f'{ttf:.0f} s'} | {at_text} | {s['peak_rss_gib']:.2f} "
            f"| {'; '.join(s.get('flagged', [])) or 'none'} |"
        )
    if "trl_start" in summary and summary["ratio_to_trl_run"] is None:
        rows.append(f"\nTRL's final accuracy ({100 * summary['trl']['final_accuracy']:.1f} %) is no "
                    f"higher than its start ({100 * summary['trl_start']:.1f} %): no time ratio; "
                    "compare the accuracies at equal training time")  # fmt: skip
    elif "ratio_to_trl_run" in summary:
        rows.append(f"\ngrpo's time to TRL's final accuracy / TRL's whole training run: "
                    f"{summary['ratio_to_trl_run']:.2f}")  # fmt: skip
        rows.append(f"grpo / TRL time to TRL's final accuracy: "
                    f"{summary['ratio_time_to_trl_final']:.2f}")  # fmt: skip
    if "ratio_peak_rss" in summary:
        rows.append(f"grpo / TRL peak RSS: {summary['ratio_peak_rss']:.2f}")
    return "\n".join(rows)


def plot(records: list[dict], summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"grpo": "tab:blue", "trl": "tab:orange"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for record in records:
        points = record["points"]
        ax.plot([p["seconds"] for p in points], [100 * p["accuracy"] for p in points],
                color=colours[record["library"]], alpha=0.35, lw=1)  # fmt: skip
    for lib, colour in colours.items():
        runs = [r["points"] for r in records if r["library"] == lib]
        if runs:  # the median accuracy of the runs at each evaluation (same steps in every run)
            xs = [statistics.median(p[i]["seconds"] for p in runs) for i in range(len(runs[0]))]
            ys = [
                statistics.median(100 * p[i]["accuracy"] for p in runs) for i in range(len(runs[0]))
            ]
            ax.plot(xs, ys, color=colour, lw=2.5, label=f"{lib} (median of {len(runs)})")
    if "trl" in summary:
        ax.axhline(100 * summary["trl"]["final_accuracy"], color="grey", ls="--", lw=1,
                   label="TRL's final accuracy (median)")  # fmt: skip
    ax.set_xlabel("training wall time (s), evaluations excluded")
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def record_depends_on(overrides: list[str]) -> list[str]:
    """The files a comparison's numbers flow through: both workers, the workload's config and
    task module, the shipped model it names, and grpo's training path."""
    from grpo.run.config_files import load_config

    path = "configs/demo.yaml"
    if overrides and overrides[0].startswith("config="):
        path = overrides[0].split("=", 1)[1]
    config = load_config(str(REPO / path), [o for o in overrides if not o.startswith("config=")])
    ours = ["bench/time_to_accuracy.py", "bench/accuracy_workers.py", "bench/trl_stops.py", path]
    return [*ours, *config_files(config), *TRAINING_PATH]


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform says."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(
            line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")
        )
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    overrides = WORKLOADS[args.workload] + list(args.set)  # config=FILE stays first
    if args.steps is not None:
        overrides.append(f"schedule.num_steps={args.steps}")
    libraries = args.libraries.split(",")
    steps = {"grpo": args.grpo_steps, "trl": args.trl_steps}
    own = {lib: [f"schedule.num_steps={steps[lib]}"] if steps[lib] else [] for lib in libraries}
    records = [record_of_run(run_dir) for run_dir in args.grpo_run]
    if args.grpo_run:  # grpo's records come from its run directories
        libraries = [lib for lib in libraries if lib != "grpo"]
    for seed in range(args.seeds):
        for lib in libraries:  # alternating, fresh processes
            record = run(lib, seed, args, overrides + own[lib])
            records.append(record)
            last = record["points"][-1]
            print(f"{lib} seed {seed}: {100 * last['accuracy']:.1f} % after {last['step']} steps, "
                  f"{last['seconds']:.0f} s of training", flush=True)  # fmt: skip
    summary = summarise(records)
    print(table(summary))
    machine = f"{platform.machine()}, {cpu_name()}, {os.cpu_count()} cores"
    results = {"workload": args.workload, "overrides": overrides, "per_library": own,
               "machine": machine, "omp_wait_policy": worker_env()["OMP_WAIT_POLICY"],
               "records": records, "summary": summary}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.record:
        write_record(args.record, results, record_depends_on(overrides))
    if args.png:
        plot(records, summary, args.png, f"{args.workload} workload: grpo and TRL 1.16")
    return summary


if __name__ == "__main__":
    main()
