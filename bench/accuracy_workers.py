"""One training run of `grpo` or TRL on a workload, with held-out accuracy against
training wall time: the worker side of `bench/time_to_accuracy.py`.

Both libraries get the same things, all taken from one grpo `RunConfig` (the
workload's config file plus its overrides: configs/demo.yaml's arithmetic on the
shipped arith-tiny model, configs/chess.yaml's move lists on the shipped
chess-tiny model, configs/smollm2_math.yaml's word problems on
SmolLM2-135M-Instruct as chat messages through its chat template, or
configs/gemma3_math.yaml's on the base model Gemma 3 270M as plain
"Question: ...\\nAnswer:" text): the same model folder, loaded in float32 with
`model.freeze`'s parameters frozen by grpo's `freeze_parameters` (no gradient, no
optimizer state), the same train and held-out problems (built by grpo's task),
each prompt exactly as grpo's policy reads it (chat messages, or the plain form's
str: TRL applies no chat template to it and tokenizes it as grpo does, one BOS),
the same reward functions and weights, B prompts x G samples per step, the same
sampling settings (max new tokens, temperature, top-p, top-k) and stop strings
(the plain form's "\\nQuestion:", which TRL 1.16 has no setting for:
`bench/trl_stops.py`, whose cut is grpo's own), AdamW at the same rate with the
same schedule, the same gradient clip, the same KL (grpo's `kl_coeff` as TRL's
`beta`, both the plain k3 estimate to a frozen copy of the starting model: TRL's
`use_bias_correction_kl` off), the same loss denominator (`TRL_LOSS_TYPES`), the
same precision (fp32, or bf16 autocast: TRL's `bf16=True`, which autocasts its
sampler's forward passes too; `auto` resolved as grpo resolves it on this CPU),
the same thread count.

The headline figure is held-out greedy accuracy, or for a task without one
(chess) the held-out greedy reward (`HEADLINE`); "accuracy" in the records
names that figure (for word problems: pooled over the held-out splits, each
split's recorded too, `EXTRA`).

Evaluation is identical too: grpo's own evaluator (greedy, the task's held-out
problems, in the task's prompt form) on a grpo policy holding a copy of the
trained weights. Its time is not counted: the clock runs only while a library
trains (sampling, rewards, loss, backward, optimizer), so "seconds" is training
wall time, and "cpu_seconds" the process's CPU time over the same spans (all
threads).

TRL 1.16 turns gradient checkpointing on by default; it is set as grpo's
(`policy.gradient_checkpointing`, off), so both store activations alike.

Where the two still differ, by design or because TRL has no setting for it:
- The sampler: grpo samples with its `rollout.engine` (configs/gemma3_math.yaml
  and smollm2's: the lean decoding loop, over a bfloat16 copy of the weights
  under bf16-mixed), TRL with transformers `generate` on its float32 weights
  under bf16 autocast. The same distribution to rounding, not the same draws.
- The stop string is found by transformers' `StopStringCriteria` in TRL and
  by decoding the new text in grpo; both end a row at the token that completes
  it, and TRL's completions are then cut by grpo's `split_completion`, so the
  reward and the loss see the same completion either way.
- TRL counts every completion that does not end in an EOS as clipped
  (`completions/clipped_ratio`), stopped ones included: a metric only
  (`mask_truncated_completions` off, and nothing is logged).
- The log-prob passes are each library's own (grpo: a group's prompt
  forwarded once, the output layer folded into a chunked log-softmax; TRL: its
  fused LM head): equal to rounding.
- TRL's process also holds the evaluator's model (float32, and under
  bf16-mixed with the lean engine the bfloat16 copy it samples with), which a
  grpo run evaluates with its own: TRL's peak RSS is that much higher (for
  Gemma 3 270M about 1.6 GiB: 1.0 in float32, 0.5 in bfloat16).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
ACCURACY = "eval/greedy/accuracy"
HEADLINE = {"chess": "eval/greedy/reward_mean"}  # task -> its figure, where not ACCURACY


EXTRA = (  # more held-out figures recorded where the task reports them (word problems, chess)
    "eval/heldout_numbers/greedy/accuracy",
    "eval/heldout_phrasings/greedy/accuracy",
    "eval/heldout_bare/greedy/accuracy",
    "eval/greedy/length_mean",
    "eval/greedy/precision",
    "eval/greedy/coverage",
    "eval/greedy/format_rate",
)
# grpo's aggregation -> TRL 1.16's loss_type with the same denominator: the tokens of the
# whole batch ("dapo"), or each completion's own before the mean over completions ("grpo")
TRL_LOSS_TYPES = {"token_mean": "dapo", "sequence_mean": "grpo"}


def headline(task: str) -> str:
    """The evaluation key a workload's runs are compared on."""
    return HEADLINE.get(task, ACCURACY)


def run_config(overrides: list[str], seed: int, run_dir: str) -> Any:
    """The workload's config: the first override may be `config=FILE` (default configs/demo.yaml)."""
    from grpo.run.config_files import load_config

    path = REPO / "configs" / "demo.yaml"
    if overrides and overrides[0].startswith("config="):
        path, overrides = REPO / overrides[0].split("=", 1)[1], overrides[1:]
    sets = [*overrides, f"seed={seed}", f"run.dir={run_dir}", "evaluation.modes=[greedy]",
            "evaluation.reference_kl=false"]  # fmt: skip
    return load_config(str(path), sets)


def point(metrics: dict, step: int, seconds: float, cpu: float, key: str = ACCURACY) -> dict:
    """One evaluation's record: the headline figure (`key`) and the task's extra figures."""
    extra = {name.split("/", 1)[1]: metrics[name] for name in EXTRA if name in metrics}
    return {"step": step, "seconds": seconds, "cpu_seconds": cpu, "accuracy": metrics[key],
            **extra}  # fmt: skip


def grpo_run(overrides: list[str], seed: int, eval_every: int, out: Path,
             until: int | None = None) -> list[dict]:  # fmt: skip
    """grpo's own loop (what `grpo train` builds); evaluations outside the clock. `until`:
    stop after that step (the schedule unchanged), as `bench/verify_record.py` replays."""
    from grpo.cli.tasks import build_task
    from grpo.run.train import build_loop, seed_everything

    config = run_config(overrides, seed, str(out / "grpo"))
    seed_everything(config.seed, config.run.deterministic, config.run.threads)
    loop, parts = build_loop(config, build_task)
    key = headline(config.task.name)
    points, seconds, cpu, sampling = [], 0.0, 0.0, 0.0
    last = config.schedule.num_steps if until is None else min(until, config.schedule.num_steps)
    for step in range(last + 1):
        if step % eval_every == 0 or step == config.schedule.num_steps:
            points.append({**point(parts.evaluate()[0], step, seconds, cpu, key),
                           "sampling_seconds": sampling})  # fmt: skip
        if step < last:
            start, start_cpu = time.perf_counter(), time.process_time()
            sampling += loop.train_step().get("time/sampling", 0.0)
            seconds += time.perf_counter() - start
            cpu += time.process_time() - start_cpu
    return points


def trl_scale(g: Any) -> str:
    """TRL's `scale_rewards` for grpo's advantages: the same group-mean baseline and divisor."""
    if g.advantage_baseline != "mean" or g.advantage_positive_only:
        raise ValueError(
            f"grpo.advantage_baseline={g.advantage_baseline!r}, advantage_positive_only="
            f"{g.advantage_positive_only}: TRL has only the group-mean baseline, both sides"
        )
    return g.advantage_scale  # "group", "batch" or "none": TRL 1.16's names for the same divisors


def trl_config(config: Any, seed: int, out: Path) -> Any:
    """TRL's GRPOConfig for the run grpo's `config` describes."""
    from trl import GRPOConfig

    from grpo.precision import resolve_precision

    # `auto` as grpo resolves it on this machine: TRL trains at the precision grpo does
    precision = resolve_precision("policy.precision", config.policy.precision, "cpu")
    s, g, gen = config.schedule, config.grpo, config.policy.generation
    if g.aggregation not in TRL_LOSS_TYPES or (g.kl_coeff and g.kl_estimator != "k3"):
        raise ValueError(
            f"grpo.aggregation={g.aggregation!r}, kl_estimator={g.kl_estimator!r}: TRL has the "
            f"same loss for aggregation in {sorted(TRL_LOSS_TYPES)} and the k3 KL alone"
        )
    # rows per forward as grpo's micro-batches; accumulated to one optimizer step per rollout
    rows = config.prompts_per_step * g.group_size
    micro = min(config.policy.micro_batch_size, rows)
    if rows % micro:
        raise ValueError(f"B x G = {rows} is not a multiple of policy.micro_batch_size {micro}")
    return GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=micro,
        num_generations=g.group_size, gradient_accumulation_steps=rows // micro,
        steps_per_generation=rows // micro,
        num_iterations=1, max_completion_length=gen.max_new_tokens, temperature=gen.temperature,
        top_p=gen.top_p, top_k=gen.top_k, beta=g.kl_coeff, use_bias_correction_kl=False,
        learning_rate=s.learning_rate,
        lr_scheduler_type=s.lr_scheduler, warmup_steps=s.warmup_steps, weight_decay=s.weight_decay,
        adam_beta1=s.adam_betas[0], adam_beta2=s.adam_betas[1], max_grad_norm=g.max_grad_norm,
        max_steps=s.num_steps, use_cpu=True, bf16=precision == "bf16-mixed",
        fp16=False, use_vllm=False,
        report_to="none", logging_strategy="no", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, seed=seed,
        loss_type=TRL_LOSS_TYPES[g.aggregation],
        scale_rewards=trl_scale(g), mask_truncated_completions=False, log_completions=False,
        gradient_checkpointing=config.policy.gradient_checkpointing,  # TRL's default is True
    )  # fmt: skip


def trl_run(overrides: list[str], seed: int, eval_every: int, out: Path) -> list[dict]:
    """TRL 1.16's GRPOTrainer (`trl_trainer`); evaluations (in a callback) are taken off the
    clock."""
    from transformers import TrainerCallback

    from grpo.cli.tasks import build_task
    from grpo.run.train import seed_everything
    config = run_config(overrides, seed, str(out / "grpo-eval"))
    seed_everything(config.seed, False, config.run.threads)
    parts = build_task(config)  # the data and the evaluator; its policy only evaluates
    key = headline(config.task.name)
    steps = config.schedule.num_steps
    points: list[dict] = []
    # training starts when TRL's first step is about to; evaluations are off both clocks
    clock = {"started": 0.0, "off": 0.0, "cpu_started": 0.0, "cpu_off": 0.0}

    def evaluate(step: int, model: Any) -> None:
        begin, begin_cpu = time.perf_counter(), time.process_time()
        parts.policy.model.load_state_dict(model.state_dict())
        seconds = begin - clock["started"] - clock["off"]
        cpu = begin_cpu - clock["cpu_started"] - clock["cpu_off"]
        points.append({**point(parts.evaluate()[0], step, seconds, cpu, key),
                       "sampling_seconds": clock["sampling"]})  # fmt: skip
        clock["off"] += time.perf_counter() - begin
        clock["cpu_off"] += time.process_time() - begin_cpu

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            clock["started"], clock["cpu_started"] = time.perf_counter(), time.process_time()
            evaluate(0, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == steps:
                evaluate(state.global_step, model)

    trainer = trl_trainer(config, parts, seed, out)
    trainer.add_callback(Evaluate())
    time_sampling(trainer.model, clock)
    torch.set_num_threads(config.run.threads or torch.get_num_threads())
    trainer.train()
    return points


def trl_trainer(config: Any, parts: Any, seed: int, out: Path) -> Any:
    """TRL's GRPOTrainer for grpo's `config` on `parts`' training rows: the model folder loaded
    in float32 with `model.freeze`'s parameters frozen (grpo's `freeze_parameters`), each row's
    prompt as grpo's policy reads it (a str for the plain form: no chat template), grpo's
    reward functions and weights, generation ending at the stop strings grpo's policy samples
    with (`trl_stops`)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl_stops import generation_kwargs, stop_at_strings

    from grpo.lm.loading import freeze_parameters

    functions, weights = trl_rewards(config, parts.reward)
    path = os.path.expanduser(config.model.path)  # grpo expands "~"; transformers does not
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if config.model.freeze:  # before TRL builds its optimizer: no Adam state for them either
        freeze_parameters(model, tuple(config.model.freeze), "model.freeze")
    stops = parts.policy.settings.generation.stop_strings  # the plain form's stop joined
    args = trl_config(config, seed, out)
    args.reward_weights, args.generation_kwargs = weights, generation_kwargs(stops)
    trainer = GRPOTrainer(
        model=model, reward_funcs=functions, args=args,
        train_dataset=Dataset.from_list([dict(r) for r in parts.train_states]),
        processing_class=AutoTokenizer.from_pretrained(path), peft_config=trl_lora(config),
    )  # fmt: skip
    stop_at_strings(trainer, stops)
    return trainer


def trl_lora(config: Any) -> Any:
    """peft's LoraConfig with grpo's `model.lora` settings, or None for full fine-tuning."""
    lora = config.model.lora
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=lora.target_modules if isinstance(lora.target_modules, str)
        else list(lora.target_modules), task_type="CAUSAL_LM",
    )  # fmt: skip


def time_sampling(model: Any, clock: dict) -> None:
    """Count the seconds TRL spends in `model.generate` (its sampler) in clock["sampling"];
    the evaluator samples with its own copy of the model, so its time is not counted."""
    generate, clock["sampling"] = model.generate, 0.0

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            clock["sampling"] += time.perf_counter() - start

    model.generate = timed


def trl_rewards(config: Any, reward: Any) -> tuple[list, list[float]]:
    """grpo's reward functions for TRL, with their weights: TRL passes a chat completion as
    a list of messages, grpo's functions take its text."""
    from grpo.tasks import arithmetic

    if config.task.name == "arithmetic":
        return [lambda prompts, completions, answer, **_: arithmetic.reward(
            prompts, completions, answer)], [1.0]  # fmt: skip

    def wrapped(name: str, function: Any) -> Any:
        def call(prompts, completions, **columns):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return function(prompts, texts, **columns)

        call.__name__ = name
        return call

    return [wrapped(n, f) for n, f in reward.functions.items()], [reward.weights[n] for n in reward.functions]


LIBRARIES = {"grpo": grpo_run, "trl": trl_run}


def main(argv: list[str]) -> None:
    """argv: LIBRARY SEED EVAL_EVERY OUT_DIR [override ...] [until=STEP] (grpo only); prints
    one JSON line last."""
    library, seed, eval_every, out, *overrides = argv
    until = [int(o.split("=", 1)[1]) for o in overrides if o.startswith("until=")]
    overrides = [o for o in overrides if not o.startswith("until=")]
    if until and library != "grpo":
        raise SystemExit("until=STEP: grpo runs only")
    stop = {"until": until[-1]} if until else {}
    points = LIBRARIES[library](overrides, int(seed), int(eval_every), Path(out), **stop)
    threads = torch.get_num_threads()  # as the run set them
    print(json.dumps({"library": library, "seed": int(seed), "threads": threads,
                      "peak_rss_gib": peak_rss_gib(), "points": points}))  # fmt: skip


def peak_rss_gib() -> float:
    """The process's peak resident memory so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


if __name__ == "__main__":
    main(sys.argv[1:])
