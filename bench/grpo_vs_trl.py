"""`grpo` against TRL's GRPOTrainer and against the bare model compute, side by side on the CPU.

    python bench/grpo_vs_trl.py                       # the default workload, 3 runs each
    python bench/grpo_vs_trl.py --model medium -G 8 -T 64 --runs 5
    python bench/grpo_vs_trl.py --model tiny -B 2 -G 2 -T 4 --steps 1 --runs 1   # seconds
    python bench/grpo_vs_trl.py --model-dir ~/.cache/grpo/models/SmolLM2-135M-Instruct-dequantized-Q4_1 \
        -T 64 --lr 1e-6 --trainers grpo_lean,trl --precision bf16-mixed   # the real model, bf16

The model (a random-init Qwen2 of `--model` size, see `common.MODEL_SIZES`)
is saved once to a temporary folder. Then, for each of `--runs` rounds, every
trainer runs in its own fresh subprocess, alternating (grpo, grpo_lean, trl,
bare, bare_lean, grpo, ...) so that slow drifts of the machine hit all of them alike.
Each subprocess takes one warm-up step and `--steps` timed optimizer steps
(`workers.py`). Reported per trainer:

- s/step: median wall time of one optimizer step over every timed step of every run;
- tokens/s: generated completion tokens over the summed step time;
- peak RSS: median over runs of the process's peak resident memory, and the
  same minus the memory after setup (model, optimizer, imports loaded);
- flagged runs: a run that started with the load average above half the cores, or
  whose CPU time over its timed steps fell under 0.8 x wall x threads (each record
  holds `load_before`, `cpu_s` per step and `threads`);
- grpo/trl: the ratio of medians; overhead: grpo's time per decoding step
  over bare's, minus 1. "grpo" samples with the default engine (transformers'
  `generate`) and is compared with "bare" (a plain KV-cache loop over the
  model's forward); "grpo_lean" samples with `rollout.engine: lean` and is
  compared with "bare_lean" (the lean loop alone). See `workers.py`.

Prints one JSON record per run and the Markdown table; `--json` writes the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import MODEL_SIZES, Workload, build_model, load_average, timing_flags  # noqa: E402

TRAINERS = ("grpo", "grpo_lean", "trl", "bare", "bare_lean")
BARE = {"grpo": "bare", "grpo_lean": "bare_lean"}  # each rollout engine and its floor
OURS = tuple(BARE)  # the default rollout engine (transformers), and the lean one


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=sorted(MODEL_SIZES))
    parser.add_argument("-B", "--prompts", type=int, default=4)
    parser.add_argument("-G", "--group-size", type=int, default=4)
    parser.add_argument("-T", "--max-new-tokens", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run")
    parser.add_argument("--runs", type=int, default=3, help="subprocesses per trainer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16-mixed"],
        help="grpo's policy.precision; bf16-mixed gives TRL bf16=True (bare: float32 always)",
    )  # fmt: skip
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    parser.add_argument("--model-dir", help="reuse a saved model folder")
    parser.add_argument("--json", help="write the summary here")
    parser.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def workload(args: argparse.Namespace) -> Workload:
    return Workload(
        model=args.model,
        prompts=args.prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        beta=args.beta,
        learning_rate=args.lr,
        steps=args.steps,
        threads=args.threads,
        precision=args.precision,
    )


def worker(args: argparse.Namespace) -> None:
    """Inside a subprocess: one run of one trainer; prints its JSON record last."""
    import torch
    from workers import WORKERS

    work = workload(args)
    torch.set_num_threads(work.threads)
    torch.manual_seed(0)
    record = WORKERS[args.worker](Path(args.model_dir), work)
    print(json.dumps({"trainer": args.worker, **record}))


def run_once(trainer: str, model_dir: Path, argv: list[str]) -> dict:
    """One run in a fresh subprocess; its record with the machine's load average just before."""
    load = load_average()
    command = [sys.executable, __file__, *argv, "--worker", trainer, "--model-dir", str(model_dir)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{trainer} run failed:\n{done.stderr[-4000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {**record, "load_before": load, "cores": os.cpu_count()}


def run_flags(record: dict) -> list[str]:
    """`timing_flags` of one run over its timed steps ([] without the measurements)."""
    if "load_before" not in record or "cpu_s" not in record:
        return []
    wall, cpu = sum(record["step_s"]), sum(record["cpu_s"])
    return timing_flags(record["load_before"], cpu, wall, record["threads"], record["cores"])


def summarise(records: list[dict]) -> dict:
    times = [t for r in records for t in r["step_s"]]
    tokens = [n for r in records for n in r["tokens"]]
    decode = [n for r in records for n in r["decode_steps"]]
    return {
        "step_s": statistics.median(times),
        "tokens_per_step": statistics.mean(tokens),
        "decode_steps": statistics.mean(decode),
        "tokens_per_s": sum(tokens) / sum(times),
        "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in records),
        "step_rss_mib": statistics.median(r["peak_rss_mib"] - r["setup_rss_mib"] for r in records),
        "steps": len(times),
        "flagged": [
            f"run {i}: {', '.join(run_flags(r))}" for i, r in enumerate(records) if run_flags(r)
        ],  # fmt: skip
    }


def table(summary: dict[str, dict]) -> str:
    rows = [
        "| trainer | s/step (median) | decoding steps | tokens/step | tokens/s | peak RSS MiB "
        "| peak - setup MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        if name in TRAINERS:
            rows.append(
                f"| {name} | {s['step_s']:.3f} | {s['decode_steps']:.1f} | "
                f"{s['tokens_per_step']:.0f} | {s['tokens_per_s']:.0f} | "
                f"{s['peak_rss_mib']:.0f} | {s['step_rss_mib']:.0f} |"
            )
    lines = "\n".join(rows)
    flagged = [f"{name} {f}" for name, s in summary.items() if name in TRAINERS
               for f in s.get("flagged", [])]  # fmt: skip
    lines += "\n\nflagged runs (load > half the cores, or CPU < 0.8 x wall x threads): "
    lines += "; ".join(flagged) or "none"
    for name in OURS:
        for key in (f"{name}/trl", f"{name}/{BARE[name]} per decoding step - 1"):
            if key in summary:
                lines += f"\n\n{key}: {summary[key]:.3f}"
    return lines


def compare(summary: dict[str, dict]) -> None:
    """Adds the ratio to TRL and the overhead over the bare compute.

    The overhead compares time per decoding step, not per generated token: a
    batch decodes all N rows until its longest completion ends, and scoring
    pads to that length, so the model compute of a step follows its decoding
    steps; rows that ended early (fewer tokens) cost the same. When grpo's
    longest completion reaches T in every step, this is the ratio of s/step.
    """
    for name in (n for n in OURS if n in summary):
        ours = summary[name]
        if "trl" in summary:
            summary[f"{name}/trl"] = ours["step_s"] / summary["trl"]["step_s"]
        if BARE[name] in summary:
            bare = summary[BARE[name]]
            per_decode = ours["step_s"] / ours["decode_steps"]
            summary[f"{name}/{BARE[name]} per decoding step - 1"] = (
                per_decode / (bare["step_s"] / bare["decode_steps"]) - 1
            )


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    trainers = [t for t in args.trainers.split(",") if t]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else Path(tmp) / args.model
        build_model(model_dir, args.model)
        records: dict[str, list[dict]] = {t: [] for t in trainers}
        for run in range(args.runs):  # A B C A B C ...: drifts hit every trainer alike
            for trainer in trainers:
                record = run_once(trainer, model_dir, argv)
                records[trainer].append(record)
                print(json.dumps({"run": run, **record}), flush=True)
    summary: dict = {t: summarise(r) for t, r in records.items()}
    compare(summary)
    summary["workload"] = workload(args).as_dict()
    print(table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
