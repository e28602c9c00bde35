"""How far each phase of a real GRPO step is from this machine's limit: measured time over least time.

    python bench/roofline.py --record roofline        # configs/smollm2_math.yaml, 1 + 3 steps
    python bench/roofline.py configs/demo.yaml --steps 2 --set prompts_per_step=8

Builds the run a config describes, as `grpo train` does (the default is
configs/smollm2_math.yaml on SmolLM2-135M-Instruct, which `grpo fetch smollm2` puts in
~/.cache/grpo/models), runs `--warmup` steps untimed (the first rollout checks the sampler,
the first optimizer step allocates Adam's state), then `--steps` steps, and prints a table
with, for each phase, means per step:

- the measured time: the step's own `time/sampling`, `time/old_logprobs` (a row only when
  that pass runs), `time/loss_backward` and `time/optimizer` (docs/metrics.md);
- the work: FLOPs and bytes counted from the model's shape and the step's own batch
  (`bench/roofline_counts.py` says what is counted and what is not);
- the limit: the larger of FLOPs at the peak matrix-product rate of the dtype the phase
  multiplies in and bytes at the peak memory bandwidth. Both peaks are measured in this
  process, at the run's thread count, before the steps: a GEMM of the model's MLP shape,
  (--gemm-rows, H) @ (H, I), in float32 and in bfloat16, best of --repeats; a copy and a sum
  of a --bandwidth-mib tensor, the faster of the two;
- "x of the limit": measured time / limit; 1 would be the hardware's limit.

The token counts come from the policy's calls during each step: every sampling call's groups
(one prompt, G completions) and every scoring call's rows, cut into micro-batches as scoring
cuts them, classified by whether they ran with gradients (the loss) or without (the old
log-probs); with a KL term, the reference's scoring calls count in the loss phase, forward only.
The counts assume full fine-tuning: under LoRA or `model.freeze` a backward computes fewer
weight gradients than the twice-the-forward counted, so its limit is set too high.
Overlapped rollouts (`run.max_staleness` > 0) are refused: their sampling runs alongside the
update and its time is not a phase of the step.

`--record NAME` writes bench/results/NAME.json; docs/performance.md shows the record named
`roofline` (`python bench/render_results.py`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # OpenMP reads it as torch loads; as in train_seeds.py's runs
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # waiting threads sleep, not spin
sys.path.insert(0, str(Path(__file__).resolve().parent))
import roofline_counts as rc  # noqa: E402
from roofline_peaks import measure_peaks  # noqa: E402
from roofline_results import table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "configs/smollm2_math.yaml"
PHASES = {  # the step's phases measured here, as docs/metrics.md names their times
    "sampling": "sampling (decoding)",
    "old_logprobs": "old log-probs",
    "loss_backward": "loss forward + backward",
    "optimizer": "optimizer (clip + AdamW)",
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PEAK_DTYPES = ("float32", "bfloat16")  # always both, whatever the run multiplies in


# ------------------------------------------------------------------ what a step computes
def _groups(actions: Sequence[Any]) -> list[tuple[int, list[int]]]:
    """Actions grouped by identical prompt, in order of first appearance -> (P, [T_j])."""
    found: dict[tuple[int, ...], list[int]] = {}
    for a in actions:
        found.setdefault(a.prompt_ids, []).append(a.num_tokens)
    return [(len(prompt), lengths) for prompt, lengths in found.items()]


class CallLog:
    """The groups (prompt length, completion lengths) the policy sampled and scored since
    `clear()`, by phase, recorded around its own methods; "reference": the reference's."""

    def __init__(self, policy: Any) -> None:
        settings = policy.settings
        self.micro_batch = settings.micro_batch_size
        self.decode_batch = settings.generation.generation_batch_size
        self.references: list[Any] = []  # kept alive, so that no id is reused
        self.clear()
        _after(policy, "generate_actions", self._sampled)
        _after(policy, "get_token_log_probabilities", self._scored("old_logprobs"))

    def watch(self, reference: Any) -> None:
        """Record `reference`'s scoring too (the trainer makes a new one every
        `ref_update_frequency` steps; None: no KL term)."""
        if reference is not None and all(r is not reference for r in self.references):
            self.references.append(reference)
            _after(reference, "get_token_log_probabilities", self._scored("reference"))

    def clear(self) -> None:
        self.groups: dict[str, list[tuple[int, list[int]]]] = {
            k: [] for k in ("sampling", "old_logprobs", "loss_backward", "reference")}  # fmt: skip
        self.passes = dict.fromkeys(self.groups, 0)  # forwards over a micro-batch
        self.decoding: list[tuple[list[int], list[int]]] = []  # per decoded batch: (P_n, T_n)

    def _sampled(self, args: tuple, out: list[list[Any]]) -> None:
        rows = [a for group in out for a in group]
        self.groups["sampling"] += [g for group in out for g in _groups(group)]
        step = self.decode_batch or len(rows)
        for s in range(0, len(rows), step):
            chunk = rows[s : s + step]
            self.decoding.append(
                ([len(a.prompt_ids) for a in chunk], [a.num_tokens for a in chunk])
            )

    def _scored(self, no_grad_phase: str) -> Callable[[tuple, Any], None]:
        import torch

        def note(args: tuple, out: Any) -> None:
            phase = "loss_backward" if torch.is_grad_enabled() else no_grad_phase
            actions = args[1]
            for s in range(0, len(actions), self.micro_batch):  # as scoring cuts them
                self.groups[phase] += _groups(actions[s : s + self.micro_batch])
                self.passes[phase] += 1

        return note


def _after(obj: Any, name: str, note: Callable[[tuple, Any], None]) -> None:
    """Make `obj.name(...)` call `note(args, result)` after it (this instance only)."""
    method = getattr(obj, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        out = method(*args, **kwargs)
        note(args, out)
        return out

    setattr(obj, name, recorded)


def phase_work(shape: rc.ModelShape, log: CallLog, dtypes: dict[str, str],
               optimizer_steps: int, trainable: int, param_bytes: int) -> dict[str, dict]:  # fmt: skip
    """FLOPs (None: not counted) and bytes of each phase of the step `log` recorded."""
    compute = DTYPE_BYTES[dtypes["scoring"]]

    def scored(phase: str) -> int:
        return sum(rc.scoring_flops(shape, p, ts) for p, ts in log.groups[phase])

    sampling = sum(rc.sampling_flops(shape, p, ts) for p, ts in log.groups["sampling"])
    decoding = sum(rc.decoding_bytes(shape, ps, ts, DTYPE_BYTES[dtypes["sampling"]])
                   for ps, ts in log.decoding)  # fmt: skip
    loss_passes = 3 * log.passes["loss_backward"] + log.passes["reference"]
    per_step = rc.adamw_bytes(trainable, param_bytes) + rc.clip_bytes(trainable, param_bytes)
    return {
        "sampling": {"flops": sampling, "bytes": decoding},
        "old_logprobs": {"flops": scored("old_logprobs"),
                         "bytes": rc.weight_pass_bytes(shape, log.passes["old_logprobs"], compute)},
        "loss_backward": {"flops": 3 * scored("loss_backward") + scored("reference"),
                          "bytes": rc.weight_pass_bytes(shape, loss_passes, compute)},
        "optimizer": {"flops": None, "bytes": optimizer_steps * per_step},
    }  # fmt: skip


def phase_dtypes(policy: Any) -> dict[str, str]:
    """The dtype each part of the step multiplies in: its precision's, else the weights'."""
    from grpo.precision import PRECISIONS

    weights = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    scoring = policy.settings.precision
    sampling = policy.rollout.precision or scoring

    def named(precision: str) -> str:
        dtype = PRECISIONS[precision]
        return weights if dtype is None else str(dtype).removeprefix("torch.")

    return {"sampling": named(sampling), "scoring": named(scoring), "weights": weights}


# ------------------------------------------------------------------ the table
def summarise(steps: list[dict], peaks: dict, dtypes: dict[str, str]) -> list[dict]:
    """Per phase, means per step of time and work, the limits and the ratio; the four phases
    together last ("these phases together", its limit the sum of theirs). A phase that never ran (old log-probs skipped) has
    no row."""
    rows = []
    bytes_per_s = peaks["memory"]["bytes_per_s"]
    for phase, name in PHASES.items():
        seconds = sum(s["phases"][phase]["seconds"] for s in steps) / len(steps)
        flops = [s["phases"][phase]["flops"] for s in steps]
        nbytes = sum(s["phases"][phase]["bytes"] for s in steps) / len(steps)
        if phase == "old_logprobs" and seconds == 0 and not any(flops):
            continue
        dtype = {"optimizer": None, "sampling": dtypes["sampling"]}.get(phase, dtypes["scoring"])
        flops_ = None if flops[0] is None else sum(flops) / len(steps)
        rate = math.inf if dtype is None else peaks["matmul"][dtype]["flops_per_s"]
        limit = rc.limit_seconds(flops_ or 0, nbytes, rate, bytes_per_s)
        rows.append({"phase": phase, "name": name, "dtype": dtype, "seconds": seconds,
                     "flops": flops_, "bytes": nbytes, "compute_s": (flops_ or 0) / rate,
                     "memory_s": nbytes / bytes_per_s, "limit_s": limit,
                     "x_of_limit": rc.times_the_limit(seconds, limit)})  # fmt: skip
    seconds, limit = sum(r["seconds"] for r in rows), sum(r["limit_s"] for r in rows)
    rows.append({"phase": "total", "name": "these phases together", "seconds": seconds,
                 "limit_s": limit, "x_of_limit": rc.times_the_limit(seconds, limit)})  # fmt: skip
    return rows


# ------------------------------------------------------------------ the run
def _tokens(log: CallLog) -> dict[str, float]:
    sampled = log.groups["sampling"]
    completions = [t for _, ts in sampled for t in ts]
    return {
        "sampled_groups": len(sampled),
        "prompt_tokens_mean": sum(p for p, _ in sampled) / max(len(sampled), 1),
        "completions": len(completions),
        "completion_tokens_mean": sum(completions) / max(len(completions), 1),
        "loss_rows": sum(len(ts) for _, ts in log.groups["loss_backward"]),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the config's run, measure the peaks, run the steps -> the record's results."""
    import torch
    from common import busy_threads, load_average, timing_flags

    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config
    from grpo.run.train import build_loop, close_policy, seed_everything

    config = load_config(args.config, [*args.set, "task.eval_size=0"])  # no evaluation runs
    if config.run.max_staleness:
        raise SystemExit(f"run.max_staleness: got {config.run.max_staleness}; allowed: 0 (an "
                         "overlapped step samples alongside the update, not as a phase of it)")  # fmt: skip
    model_path = Path(config.model.path).expanduser()
    if not model_path.is_dir():
        raise SystemExit(f"model.path: no folder {model_path}; for SmolLM2-135M-Instruct run "
                         "`grpo fetch smollm2`, or pass --set model.path=FOLDER")  # fmt: skip
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    loop, parts = build_loop(config, build_task)
    try:
        with loop:
            policy, trainer = parts.policy, loop.trainer
            shape = rc.ModelShape.from_config(policy.model.config)
            dtypes = phase_dtypes(policy)
            used = sorted({dtypes["sampling"], dtypes["scoring"], *PEAK_DTYPES})
            mlp = (args.gemm_rows, shape.hidden, shape.intermediate)  # (tokens, H) @ (H, I)
            peaks = measure_peaks(used, mlp, args.bandwidth_mib, args.repeats)
            log = CallLog(policy)
            trainable = [p for p in policy.get_parameters().values() if p.requires_grad]
            count, param_bytes = sum(p.numel() for p in trainable), trainable[0].element_size()
            for _ in range(args.warmup):
                log.watch(trainer.reference_policy)
                loop.train_step()
            load, cpu, wall = load_average(), time.process_time(), time.perf_counter()
            steps = []
            for _ in range(args.steps):
                log.clear()
                log.watch(trainer.reference_policy)
                metrics = loop.train_step()
                work = phase_work(shape, log, dtypes, int(metrics["optimizer_steps"]), count,
                                  param_bytes)  # fmt: skip
                for phase, entry in work.items():
                    entry["seconds"] = metrics[f"time/{phase}"]
                steps.append({"phases": work, "tokens": _tokens(log),
                              "time/step": metrics["time/step"]})  # fmt: skip
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        close_policy(parts.policy)
    threads = torch.get_num_threads()
    return {
        "config": args.config, "overrides": list(args.set), "warmup_steps": args.warmup,
        "steps": args.steps,
        "model": {"path": str(config.model.path), "model_type": policy.model.config.model_type,
                  **vars(shape), "matmul_params": rc.matmul_params(shape),
                  "trainable_params": count},
        "dtypes": dtypes, "peaks": peaks,
        "phases": summarise(steps, peaks, dtypes),
        "tokens_per_step": {k: sum(s["tokens"][k] for s in steps) / len(steps)
                            for k in steps[0]["tokens"]},
        "per_step": steps,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "load_before": load, "cpu_seconds": cpu, "wall_seconds": wall,
        "flags": timing_flags(load, cpu, wall, busy_threads(threads, dict(os.environ))),
    }  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override, as for grpo train")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=3, help="measured steps")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of each peak")
    parser.add_argument("--gemm-rows", type=int, default=512, help="rows of the peak GEMM")
    parser.add_argument("--bandwidth-mib", type=int, default=256, help="size of the copied tensor")
    parser.add_argument("--record", metavar="NAME", help="write bench/results/NAME.json")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps {args.steps} --warmup {args.warmup}: allowed: >= 1 and >= 0")
    return args


def main(argv: Sequence[str] | None = None, folder: Path | None = None) -> dict[str, Any]:
    """Measure, print the table, and write the record `--record` names (into `folder`)."""
    args = parse_args(argv)
    results = measure(args)
    print(table(results))
    if args.record:
        from records import RESULTS, TRAINING_PATH, write_record

        config = Path(args.config).resolve()
        inside = [config.relative_to(REPO).as_posix()] if config.is_relative_to(REPO) else []
        depends = [*TRAINING_PATH, "grpo/tasks", *inside, "bench/roofline.py",
                   "bench/roofline_counts.py", "bench/roofline_peaks.py"]  # fmt: skip
        shown = None if argv is None else ["bench/roofline.py", *argv]
        path = write_record(args.record, results, depends, shown, folder or RESULTS)
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
