"""How far each phase of a real GRPO step is from this machine's limit: measured time over least time.

    python bench/roofline.py --record roofline        # configs/smollm2_math.yaml, 1 + 3 steps
    python bench/roofline.py configs/gemma3_math.yaml --record roofline_gemma
    python bench/roofline.py configs/demo.yaml --steps 2 --set prompts_per_step=8

Builds the run a config describes, as `grpo train` does (the default is
configs/smollm2_math.yaml on SmolLM2-135M-Instruct, which `grpo fetch smollm2` puts in
~/.cache/grpo/models), runs `--warmup` steps untimed (the first rollout checks the sampler,
the first optimizer step allocates Adam's state), then `--steps` steps, and prints a table
with, for each phase, means per step:

- the measured time: the step's own `time/sampling`, `time/old_logprobs` (a row only when
  that pass runs), `time/loss_backward` and `time/optimizer` (docs/metrics.md);
- the work: FLOPs and bytes counted from the model's shape, which of its weights train, and
  the step's own batch (`bench/roofline_counts.py` says what is counted and what is not);
- the limit: the larger of FLOPs at the peak matrix-product rate of the dtype the phase
  multiplies in and bytes at the peak memory bandwidth. Both peaks are measured in this
  process, at the run's thread count, before the steps and again after each measured step:
  a GEMM of the model's MLP shape, (--gemm-rows, H) @ (H, I), in float32 and in bfloat16, best
  of --repeats; a copy and a sum of a --bandwidth-mib tensor, the faster of the two. The limit
  takes the fastest of these measurements (`roofline_peaks.best_peaks`), and the record keeps
  every one's product rate: a shared machine's speed moves from minute to minute;
- "x of the limit": measured time / limit; 1 would be the hardware's limit;
- the peak resident memory (RSS) while the phase ran, the largest of the measured steps
  (`bench/roofline_memory.py`: the kernel's high-water mark, reset at each phase boundary).

The token counts come from the policy's calls during each step: every sampling call's groups
(one prompt, G completions) and every scoring call's rows, cut into micro-batches as scoring
cuts them, classified by whether they ran with gradients (the loss) or without (the old
log-probs); with a KL term, the reference's scoring calls count in the loss phase, forward only.
Which weights train is read off the model (`trainable_matmuls`): a weight frozen by
`model.freeze` gets no weight gradient in the backward and no optimizer bytes; under LoRA the
base weights are frozen and the adapters count as trained weights (their forward, r/H of a
layer's, is not counted). The record also keeps the trainable parameters and the bytes of
Adam's state after the warm-up, so two records, frozen and not, show what freezing saves.
Overlapped rollouts (`run.max_staleness` > 0) are refused: their sampling runs alongside the
update and its time is not a phase of the step.

`--record NAME` writes bench/results/NAME.json; docs/performance.md shows the records named
`roofline` (SmolLM2), `roofline_gemma` (Gemma 3 270M, its embedding frozen as its config has
it) and `roofline_gemma_unfrozen` (the same with `--set "model.freeze=[]"`), alone and side by
side (`bench/roofline_results.py`, `python bench/render_results.py`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # OpenMP reads it as torch loads; as in train_seeds.py's runs
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # waiting threads sleep, not spin
sys.path.insert(0, str(Path(__file__).resolve().parent))
import roofline_counts as rc  # noqa: E402
from roofline_calls import CallLog  # noqa: E402
from roofline_memory import PhasePeaks, status_bytes  # noqa: E402
from roofline_peaks import best_peaks, measure_peaks  # noqa: E402
from roofline_results import PHASES, table  # noqa: E402

DEFAULT_CONFIG = "configs/smollm2_math.yaml"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PEAK_DTYPES = ("float32", "bfloat16")  # always both, whatever the run multiplies in


# ------------------------------------------------------------------ what a step computes
def phase_work(shape: rc.ModelShape, trainable: rc.Trainable, log: CallLog,
               dtypes: dict[str, str], optimizer_steps: int, params: int,
               param_bytes: int) -> dict[str, dict]:  # fmt: skip
    """FLOPs (None: not counted) and bytes of each phase of the step `log` recorded; `params`
    trainable parameters of `param_bytes` each are clipped and stepped by AdamW."""
    compute = DTYPE_BYTES[dtypes["scoring"]]

    def scored(phase: str) -> int:
        return sum(rc.scoring_flops(shape, p, ts) for p, ts in log.groups[phase])

    loss = sum(rc.scoring_flops(shape, p, ts) + rc.backward_flops(shape, trainable, p, ts)
               for p, ts in log.groups["loss_backward"])  # fmt: skip
    sampling = sum(rc.sampling_flops(shape, p, ts) for p, ts in log.groups["sampling"])
    decoding = sum(rc.decoding_bytes(shape, ps, ts, DTYPE_BYTES[dtypes["sampling"]])
                   for ps, ts in log.decoding)  # fmt: skip
    loss_bytes = rc.loss_pass_bytes(shape, trainable, log.passes["loss_backward"], compute)
    per_step = rc.adamw_bytes(params, param_bytes) + rc.clip_bytes(params, param_bytes)
    return {
        "sampling": {"flops": sampling, "bytes": decoding},
        "old_logprobs": {"flops": scored("old_logprobs"),
                         "bytes": rc.weight_pass_bytes(shape, log.passes["old_logprobs"], compute)},
        "loss_backward": {"flops": loss + scored("reference"),
                          "bytes": loss_bytes + rc.weight_pass_bytes(shape, log.passes["reference"],
                                                                     compute)},
        "optimizer": {"flops": None, "bytes": optimizer_steps * per_step},
    }  # fmt: skip


def trainable_matmuls(model: Any) -> rc.Trainable:
    """Which weights of `model`'s matrix products train: the `torch.nn.Linear` weights that
    require a gradient (a LoRA model's adapters, not its frozen base weights), the output
    layer's apart (frozen with the embedding it is tied to)."""
    import torch

    output = model.get_output_embeddings()
    layers = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and m is not output and m.weight.requires_grad)  # fmt: skip
    return rc.Trainable(layers, bool(output.weight.requires_grad))


def state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors an optimizer keeps (AdamW: both moments and the step of each
    parameter it has stepped)."""
    import torch

    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if isinstance(t, torch.Tensor))  # fmt: skip


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
def _largest(values: list[int | None]) -> int | None:
    """The largest peak measured; None when there is none (the peaks were not measured, or
    the phase never ran: a step whose groups all scored alike runs no loss)."""
    measured = [v for v in values if v is not None]
    return max(measured) if measured else None


def summarise(steps: list[dict], peaks: dict, dtypes: dict[str, str]) -> list[dict]:
    """Per phase, means per step of time and work, the limits and the ratio, and the largest
    peak RSS of any step; the phases together last ("these phases together": its limit the
    sum of theirs, its peak the largest). A phase that never ran (old log-probs skipped) has
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
        peak = _largest([s["phases"][phase].get("peak_rss_bytes") for s in steps])
        rows.append({"phase": phase, "name": name, "dtype": dtype, "seconds": seconds,
                     "flops": flops_, "bytes": nbytes, "compute_s": (flops_ or 0) / rate,
                     "memory_s": nbytes / bytes_per_s, "limit_s": limit,
                     "x_of_limit": rc.times_the_limit(seconds, limit),
                     "peak_rss_bytes": peak})  # fmt: skip
    seconds, limit = sum(r["seconds"] for r in rows), sum(r["limit_s"] for r in rows)
    rows.append({"phase": "total", "name": "these phases together", "seconds": seconds,
                 "limit_s": limit, "x_of_limit": rc.times_the_limit(seconds, limit),
                 "peak_rss_bytes": _largest([r["peak_rss_bytes"] for r in rows])})  # fmt: skip
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
    from grpo.step.timing import StepTimer

    load = load_average()  # before this run adds its own
    config = load_config(args.config, [*args.set, "task.eval_size=0"])  # no evaluation runs
    if config.run.max_staleness:
        raise SystemExit(f"run.max_staleness: got {config.run.max_staleness}; allowed: 0 (an "
                         "overlapped step samples alongside the update, not as a phase of it)")  # fmt: skip
    model_path = Path(config.model.path).expanduser()
    if not model_path.is_dir():
        raise SystemExit(f"model.path: no folder {model_path}; `grpo fetch smollm2` (SmolLM2) or "
                         "`grpo fetch gemma3-270m --accept-license gemma` (Gemma 3 270M) puts it "
                         "there, or pass --set model.path=FOLDER")  # fmt: skip
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    loop, parts = build_loop(config, build_task)
    memory = PhasePeaks()
    try:
        with loop, memory.watching(StepTimer):
            policy, trainer = parts.policy, loop.trainer
            shape = rc.ModelShape.from_config(policy.model.config)
            trains = trainable_matmuls(policy.model)
            dtypes = phase_dtypes(policy)
            used = sorted({dtypes["sampling"], dtypes["scoring"], *PEAK_DTYPES})
            mlp = (args.gemm_rows, shape.hidden, shape.intermediate)  # (tokens, H) @ (H, I)
            peak_samples = [measure_peaks(used, mlp, args.bandwidth_mib, args.repeats)]
            log = CallLog(policy)
            trainable = [p for p in policy.get_parameters().values() if p.requires_grad]
            count, param_bytes = sum(p.numel() for p in trainable), trainable[0].element_size()
            for _ in range(args.warmup):
                log.watch(trainer.reference_policy)
                loop.train_step()
            adam = state_bytes(trainer.optimizer)  # allocated by the warm-up's optimizer step
            resident = status_bytes("VmRSS") if memory.available else None
            cpu, wall = time.process_time(), time.perf_counter()
            steps = []
            for _ in range(args.steps):
                log.clear()
                memory.clear()
                log.watch(trainer.reference_policy)
                metrics = loop.train_step()
                work = phase_work(shape, trains, log, dtypes, int(metrics["optimizer_steps"]),
                                  count, param_bytes)  # fmt: skip
                for phase, entry in work.items():
                    entry["seconds"] = metrics[f"time/{phase}"]
                    entry["peak_rss_bytes"] = memory.peak(phase)
                steps.append({"phases": work, "tokens": _tokens(log),
                              "time/step": metrics["time/step"]})  # fmt: skip
                peak_samples.append(measure_peaks(used, mlp, args.bandwidth_mib, args.repeats))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            peaks = best_peaks(peak_samples)
    finally:
        close_policy(parts.policy)
    threads = torch.get_num_threads()
    generation = config.policy.generation
    return {
        "config": args.config, "overrides": list(args.set), "warmup_steps": args.warmup,
        "steps": args.steps,
        "batch": {"prompts": config.prompts_per_step, "group_size": config.grpo.group_size,
                  "max_new_tokens": generation.max_new_tokens,
                  "micro_batch_size": config.policy.micro_batch_size},
        "model": {"path": str(config.model.path), "model_type": policy.model.config.model_type,
                  **vars(shape), "matmul_params": rc.matmul_params(shape),
                  "trainable_params": count, "trainable_matmul_params": trains.weights(shape),
                  "frozen": list(config.model.freeze), "optimizer_state_bytes": adam},
        "dtypes": dtypes, "peaks": peaks, "rss_after_warmup_bytes": resident,
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
        from records import RESULTS, write_config_record

        scripts = ["bench/roofline.py", "bench/roofline_calls.py", "bench/roofline_counts.py",
                   "bench/roofline_memory.py", "bench/roofline_peaks.py"]  # fmt: skip
        write_config_record(args.record, results, args.config, scripts, argv, folder or RESULTS)
    return results


if __name__ == "__main__":
    main()
