"""Overlapped rollouts: accuracy at equal steps, and stage times (the demo by default).

Two measurements (docs/async.md reports them):

`accuracy`: the demo (configs/demo.yaml) trained synchronously (`run.max_staleness`
0) and overlapped (1 and 2), each from `--seeds` seeds, alternating k within each
seed; held-out greedy accuracy (the 500 problems) after `--steps` steps, the
schedule shortened to them (warm-up and cosine over `--steps`). The claim checked:
max_staleness 1 ends within the spread of the synchronous seeds.

`timing`: each stage computes with `--threads` torch threads, so the overlapped run
uses twice as many cores; `--set run.rollout_worker=process` samples in a process
instead of a thread. In each of `--rounds` rounds:
- the overlapped loop (max_staleness 1) for `--steps` steps, each step's wall
  time (the trainer's wait for samples, its update and the weights' copy);
- a replay of the same steps from the same seed, one stage at a time: the
  sampler stage (sample step s's batch with version s - 1 and score the
  sampler's log-probs, unless the policy weighs its rollouts itself, as the
  producer skips it then) with a copy of the policy, then the trainer stage
  (one update on that batch). The sampler draws the same random numbers as the
  overlapped run's, so these are the same batches (checked step by step
  through the mean reward: `replay_same_batches_steps` is the number of steps
  before the first that differs).
Overlapped, step s trains batch s while batch s + 1 is sampled: the goal is
overlapped steps <= 1.15 x the sum over the same steps of max(trainer stage of
s, sampler stage of s + 1) alone (`overlapped_over_paired_slower_stage`); the
first `--warmup` steps and the last are left out. Medians per round as well.

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
    """One round: the overlapped loop, then the same steps replayed with each stage alone;
    seconds (medians, and the paired ratio)."""
    from grpo.precision import hold_weight_cache_off, release_weight_cache
    from grpo.run.overlap import RolloutProducer

    loop, _ = _loop(steps, 0, 1, threads, "/tmp/staleness-bench/timing", workload)
    walls = []
    try:
        for _ in range(steps):
            begin = time.perf_counter()
            loop.train_step()
            walls.append(time.perf_counter() - begin)
    finally:
        loop.close()  # its worker has ended: the replay below runs alone
    # the replay: the same seed, the same schedule (step s samples with version s - 1), one
    # stage at a time; the sampler draws the same numbers, so the batches are the same. A
    # sampling thread runs autocast without its weight cache (grpo.precision): so does its replay
    thread = type(loop.producer) is RolloutProducer
    if thread:
        hold_weight_cache_off()
    try:
        replay, sampler, train, same = _replay(steps, threads, loop.history, workload)
    finally:
        if thread:
            release_weight_cache()
    # overlapped, step s trains batch s while batch s + 1 is sampled: its slower stage alone
    # is max(train[s], sampler[s + 1]); the last step has no later batch
    measured = range(warmup, steps - 1)
    paired = sum(max(train[s], sampler[s + 1]) for s in measured)
    h = loop.history[warmup:]
    return {
        "overlapped_step": statistics.median(walls[warmup:]),
        "sampler_alone": statistics.median(sampler[warmup:]),
        "trainer_alone": statistics.median(train[warmup:]),
        "overlapped_over_paired_slower_stage": sum(walls[s] for s in measured) / paired,
        "replay_same_batches_steps": same,  # = steps when every replayed batch was the run's
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


def _replay(
    steps: int, threads: int, history: list[dict[str, Any]], workload: tuple[str, list[str]]
) -> tuple[Any, list[float], list[float], int]:
    """The overlapped run's steps again from the same seed, one stage at a time: the loop,
    each step's sampler and trainer seconds, and how many steps sampled the run's batches."""
    from grpo.run.stamped import copy_weights, sample_stamped
    from grpo.step.staleness import sampling_version

    replay, _ = _loop(steps, 0, 1, threads, "/tmp/staleness-bench/replay", workload)
    trainer, G = replay.trainer, replay.trainer.config.group_size
    sampler_copy = copy.deepcopy(trainer.policy)
    versions = {0: _weights(trainer.policy)}
    sampler, train, same = [], [], steps
    for step in range(steps):
        version = sampling_version(step, 1, 0)
        if version in versions:  # the version step s samples with: loaded once
            copy_weights(sampler_copy.get_parameters(), versions.pop(version))
        begin = time.perf_counter()
        batch = sample_stamped(sampler_copy, trainer.reward_model, next(replay.sampler), G,
                               step, version)  # fmt: skip
        sampler.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        metrics = trainer.train_step(batch.rollout.states[::G], rollout=batch.rollout)
        train.append(time.perf_counter() - begin)
        replay.scheduler.step()
        versions[step + 1] = _weights(trainer.policy)
        if metrics["reward/mean"] != history[step]["reward/mean"] and same == steps:
            same = step  # from here the replay's batches are not the run's: say so
    replay.close()
    return replay, sampler, train, same


def _weights(policy: Any) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in policy.get_parameters().items()}


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
