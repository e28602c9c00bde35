"""GRPO on a causal language model with text rewards: the text adapter of `TrainingLoop`.

Each step draws B prompt records, and `GRPOTrainer.train_step` samples G
completions per prompt, scores them with the `TextReward`, and runs
μ = `grpo.num_epochs_per_update` epochs over mini-batches of `grpo.batch_size`
samples, `grpo.gradient_accumulation_steps` mini-batches per optimizer step,
clipping the gradient norm at `grpo.max_grad_norm`. Old log-probs are recorded
once per generation, so epochs after the first are importance-weighted.

This module adds what is specific to text: loading the model (optionally with
LoRA), prompt datasets, and held-out evaluation of reward and accuracy (greedy
and sampled); `grpo.run.loop.TrainingLoop` runs the schedule, the evaluations at
the start, every `evaluation.every` steps and at the end, and the metrics.

Choices (departures from seed 001 and seed 004's defaults):
- The reference policy is fixed for the whole run (`ref_update_frequency=0`),
  as in seed 001; with LoRA it is the base model with adapters disabled.
- μ defaults to 1 (one gradient pass per generation, as most text GRPO runs do)
  and the entropy bonus to 0.

Metrics per step (besides the trainer's and the loop's): "completion/length_mean|max",
"completion/truncated_frac", "completion/eos_frac", "entropy/rollout_mean",
"rewards/<fn>/mean|std|applied_frac", "reward/positive_frac". Evaluation records
hold "eval/<mode>/reward_mean", "eval/<mode>/accuracy", ... and "eval/samples".
`docs/metrics.md` explains every one.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings
from grpo.lm.loading import LoraSettings, is_peft_model
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.rewards.combine import TextReward
from grpo.run.data import check_prompt_lengths, load_prompts
from grpo.run.evaluation import MODES, evaluate
from grpo.run.loop import (
    SCHEDULERS,
    ScheduleConfig,
    StateSampler,
    TrainingLoop,
    check_int,
    make_optimizer,
)
from grpo.step.trainer import GRPOTrainer

__all__ = ["EvalConfig", "ScheduleConfig", "TextGRPOConfig", "TextGRPOTrainer", "SCHEDULERS"]

log = logging.getLogger("grpo")


@dataclass
class EvalConfig:
    """Held-out evaluation: always at the start and the end, and every `every` steps."""

    every: int = 0
    """Evaluate after every this many steps as well; 0 = only at start and end."""
    modes: tuple[str, ...] = ("greedy", "sampled")
    """Greedy decoding and/or the policy's own sampling settings."""
    samples_per_prompt: int = 1
    """Completions per prompt in the sampled mode."""
    batch_size: int = 32
    """Prompts per generation call."""
    num_logged_samples: int = 3
    """(prompt, completion, reward) examples logged per mode at each evaluation."""

    def __post_init__(self) -> None:
        self.modes = tuple(self.modes)
        check_int("evaluation", "every", self.every, minimum=0)
        check_int("evaluation", "samples_per_prompt", self.samples_per_prompt)
        check_int("evaluation", "batch_size", self.batch_size)
        check_int("evaluation", "num_logged_samples", self.num_logged_samples, minimum=0)
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"evaluation.modes: got {mode!r}; allowed: {', '.join(MODES)}")


def _text_grpo_defaults() -> GRPOConfig:
    return GRPOConfig(num_epochs_per_update=1, ref_update_frequency=0, entropy_coeff=0.0)


@dataclass
class TextGRPOConfig:
    """Everything a text GRPO run needs beyond the model and the reward functions."""

    prompts_per_step: int = 8
    """B: prompts per generation batch (each gets grpo.group_size completions)."""
    grpo: GRPOConfig = field(default_factory=_text_grpo_defaults)
    """The trainer's settings: G, mini-batch size, μ (num_epochs_per_update), clipping, KL."""
    policy: CausalLMSettings = field(default_factory=CausalLMSettings)
    """Sampling (temperature, top_p, max_new_tokens, ...) and scoring settings."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Optimiser and learning-rate schedule."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    lora: LoraSettings | None = None
    """Train LoRA adapters instead of all weights (needs peft); None = full fine-tuning."""
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    """Sampling engine: the model's own generate, or vLLM sharing its weights (one GPU)."""
    model_path: str | None = None
    """Folder (or hub id) to load when no policy object is given."""
    dtype: str = "auto"
    """Weights dtype when loading: auto, float32, bfloat16 or float16."""
    device: str | None = None
    """Device to move the model to when loading; None = where it loads."""
    output_dir: str | None = None
    """Where the final model (or adapter) and tokenizer are saved; None = not saved."""
    save_merged: bool = False
    """With LoRA, also save the adapter merged into the weights (output_dir/merged)."""
    seed: int = 0
    """Seeds the prompt order."""

    def __post_init__(self) -> None:
        check_int("config", "prompts_per_step", self.prompts_per_step)
        check_int("config", "seed", self.seed, minimum=0)
        for name, kind in (
            ("grpo", GRPOConfig),
            ("policy", CausalLMSettings),
            ("schedule", ScheduleConfig),
            ("evaluation", EvalConfig),
        ):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(
                    f"config.{name}: got {type(getattr(self, name)).__name__}; allowed: {kind.__name__}"
                )


class TextGRPOTrainer:
    """Runs `config.schedule.num_steps` GRPO steps on text prompts, evaluating and logging."""

    def __init__(
        self,
        config: TextGRPOConfig,
        reward: TextReward | Callable | Sequence[Callable],
        train_prompts: Any,
        eval_prompts: Any = None,
        *,
        policy: CausalLMPolicy | None = None,
        accuracy: Callable[..., Sequence[Any]] | None = None,
        sink: Any = None,
    ) -> None:
        self.config = config
        self.reward = reward if isinstance(reward, TextReward) else TextReward(reward)
        self.policy = policy if policy is not None else self._load_policy()
        self.train_prompts = load_prompts(train_prompts, name="train_prompts")
        self.eval_prompts = (
            None if eval_prompts is None else load_prompts(eval_prompts, name="eval_prompts")
        )
        check_prompt_lengths(self.train_prompts, self.policy, name="train_prompts")
        if self.eval_prompts is not None:
            check_prompt_lengths(self.eval_prompts, self.policy, name="eval_prompts")
        self.accuracy = accuracy
        grpo = config.grpo
        if is_peft_model(self.policy.model) and grpo.kl_coeff > 0 and grpo.ref_update_frequency > 0:
            warnings.warn(
                "with LoRA the reference is the base model (adapters disabled) and does not follow "
                f"ref_update_frequency={grpo.ref_update_frequency}",
                UserWarning,
                stacklevel=2,
            )
        self.trainer = GRPOTrainer(self.policy, self.reward, make_optimizer(config.schedule), grpo)
        sampler = StateSampler(self.train_prompts, config.prompts_per_step, seed=config.seed)
        self.loop = TrainingLoop(
            self.trainer,
            sampler,
            config.schedule,
            evaluate=self._evaluate if self.eval_prompts is not None else None,
            eval_every=config.evaluation.every,
            sink=sink,
        )

    def _load_policy(self) -> CausalLMPolicy:
        c = self.config
        if c.model_path is None:
            raise ValueError("config.model_path: got None; give a model folder or pass policy=")
        return CausalLMPolicy.from_pretrained(
            c.model_path, c.policy, lora=c.lora, dtype=c.dtype, device=c.device, rollout=c.rollout
        )

    # the loop's state, under the names this class has always had
    optimizer = property(lambda self: self.trainer.optimizer)
    scheduler = property(lambda self: self.loop.scheduler)
    history = property(lambda self: self.loop.history)
    evaluations = property(lambda self: self.loop.evaluations)
    step = property(lambda self: self.loop.step)

    def train(self) -> list[dict[str, Any]]:
        """Evaluate, run every step (evaluating every k), evaluate, save; returns the step records."""
        history = self.loop.train()
        if self.config.output_dir is not None:
            self.policy.save_pretrained(self.config.output_dir, merged=self.config.save_merged)
        return history

    def train_step(self) -> dict[str, Any]:
        """One GRPO step on the next B prompts; returns (and logs) its metrics."""
        return self.loop.train_step()

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics now (empty when there are no eval prompts); logged with samples."""
        return self.loop.evaluate()

    def _evaluate(self) -> tuple[dict[str, float], list[dict[str, Any]]]:
        e = self.config.evaluation
        metrics, samples = evaluate(
            self.policy,
            self.eval_prompts,
            self.reward,
            accuracy=self.accuracy,
            modes=e.modes,
            samples_per_prompt=e.samples_per_prompt,
            batch_size=e.batch_size,
            num_logged_samples=e.num_logged_samples,
        )
        for sample in samples:
            log.info("step %d eval sample %s", self.loop.step, sample)
        return metrics, samples
