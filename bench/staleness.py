"""Overlapped rollouts: accuracy at equal steps, and stage times (the demo by default).

Two measurements (docs/async.md reports them):

`accuracy`: the demo (configs/demo.yaml) trained synchronously (`run.max_staleness`
0) and overlapped (1 and 2), each from `--seeds` seeds, alternating k within each
seed; held-out greedy accuracy (the 500 problems) after `--steps` steps, the
schedule shortened to them (warm-up and cosine over `--steps`). The claim checked:
max_staleness 1 ends within the spread of the synchronous seeds.

`timing`: one thread per stage (torch's thread count is process-wide; each stage
runs its torch ops with `--threads` threads, so the overlapped run uses twice as
many cores). In each of `--rounds` rounds, alternating:
- the overlapped loop (max_staleness 1) for `--steps` steps, each step's wall
  time (the trainer's wait for samples, its update and the weights' copy);
- the sampler stage alone: sample a stale batch and score the sampler's
  log-probs (unless the policy weighs its rollouts itself, as the producer
  skips it then), with a copy of the policy, nothing else running;
- the trainer stage alone: one update on such a batch (π_old recomputed when
  it carries the sampler's log-probs).
Medians per round, the first `--warmup` steps of each block left out. The goal:
overlapped step <= 1.15 x the slower stage alone.

    nice -n 19 python bench/staleness.py accuracy --seeds 3 --steps 300 --json acc.json
    nice -n 19 python bench/staleness.py timing --rounds 3 --steps 20 --json timing.json

Another workload: `--config FILE` with `--set KEY=VALUE` overrides (repeatable), e.g.
the real model, `--config configs/smollm2_math.yaml --threads 1 --steps 4 --warmup 1`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ACCURACY = "eval/greedy/accuracy"


DEMO = (str(REPO / "configs" / "demo.yaml"), [])  # the workload: a config file, its --set


def _loop(
    steps: int, seed: int, k: int, threads: int, run_dir: str, workload: tuple[str, list[str]]
) -> tuple[Any, Any]:
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config
    from grpo.run.train import build_loop, seed_everything

    sets = [
        *workload[1], f"seed={seed}", f"run.dir={run_dir}", f"run.max_staleness={k}",
        f"run.threads={threads}", f"schedule.num_steps={steps}", "evaluation.modes=[greedy]",
    ]  # fmt: skip
    config = load_config(workload[0], sets)
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    return build_loop(config, build_task)


def accuracy_run(
    steps: int, seed: int, k: int, threads: int, workload: tuple[str, list[str]] = DEMO
) -> dict[str, Any]:
    """One run of `steps` steps; its final held-out accuracy and wall time."""
    loop, parts = _loop(steps, seed, k, threads, f"/tmp/staleness-bench/{seed}-{k}", workload)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        for _ in range(steps):
            loop.train_step()
    finally:
        loop.close()
    seconds = time.perf_counter() - start
    stale = [row.get("staleness/mean", 0.0) for row in loop.history]
    return {
        "k": k, "seed": seed, "steps": steps, "accuracy": parts.evaluate()[0][ACCURACY],
        "train_seconds": seconds, "load_before": load, "staleness_mean": statistics.mean(stale),
        "reward_last20": statistics.mean(row["reward/mean"] for row in loop.history[-20:]),
    }  # fmt: skip


def stage_times(
    steps: int, threads: int, warmup: int, workload: tuple[str, list[str]] = DEMO
) -> dict[str, float]:
    """One round: overlapped steps, then each stage alone; medians in seconds."""
    from grpo.protocols import hook
    from grpo.step.collect import sample_rollout, score_old_logprobs

    loop, parts = _loop(steps, 0, 1, threads, "/tmp/staleness-bench/timing", workload)
    walls = []
    try:
        for _ in range(steps):
            begin = time.perf_counter()
            loop.train_step()
            walls.append(time.perf_counter() - begin)
    finally:
        loop.close()  # its thread has ended: the stages below run alone
    trainer = loop.trainer
    sampler_policy = copy.deepcopy(trainer.policy)
    G = trainer.config.group_size
    sampler, train = [], []
    for _ in range(steps):
        begin = time.perf_counter()
        rollout = sample_rollout(sampler_policy, trainer.reward_model, next(loop.sampler), G)
        if hook(sampler_policy, "weighs_rollouts") is not True:  # as the producer does
            scored = score_old_logprobs(sampler_policy, rollout)
            rollout = rollout._replace(sampler_logprobs=scored.old_logprobs)
        sampler.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        trainer.train_step(rollout.states[::G], rollout=rollout)
        train.append(time.perf_counter() - begin)
    h = loop.history[warmup:]
    return {
        "overlapped_step": statistics.median(walls[warmup:]),
        "sampler_alone": statistics.median(sampler[warmup:]),
        "trainer_alone": statistics.median(train[warmup:]),
        "overlapped_trainer_update": statistics.median(
            r["time/step"] - r["time/wait_samples"] - r["time/publish_weights"] for r in h
        ),
        "overlapped_sampler": statistics.median(
            sum(r[f"time/sampler/{name}"] for name in ("sampling", "rewards", "logprobs"))
            for r in h
        ),
        "wait_samples": statistics.median(r["time/wait_samples"] for r in h),
        "wait_weights": statistics.median(r["time/wait_weights"] for r in h),
        "publish_weights": statistics.median(r["time/publish_weights"] for r in h),
        "load_before": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["accuracy", "timing"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ks", default="0,1,2", help="max_staleness values (accuracy)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each stage")
    parser.add_argument("--json", default=None, help="append one record per line here")
    parser.add_argument("--config", default=DEMO[0], help="the workload (default: the demo)")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE, repeatable")
    args = parser.parse_args()
    workload = (args.config, args.set)
    records = []
    if args.what == "accuracy":
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for k in [int(k) for k in args.ks.split(",")]:
                records.append(accuracy_run(args.steps, seed, k, args.threads, workload))
                print(json.dumps(records[-1]), flush=True)
    else:
        for _ in range(args.rounds):
            record = stage_times(args.steps, args.threads, args.warmup, workload)
            slower = max(record["sampler_alone"], record["trainer_alone"])
            record["overlapped_over_slower_stage"] = record["overlapped_step"] / slower
            records.append(record)
            print(json.dumps(record), flush=True)
    if args.json:
        with open(args.json, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
