"""GRPO on a causal language model with text rewards: the loop around `GRPOTrainer`.

Each step draws B prompt records, and `GRPOTrainer.train_step` samples G
completions per prompt, scores them with the `TextReward`, and runs
μ = `grpo.num_epochs_per_update` epochs over mini-batches of `grpo.batch_size`
samples, `grpo.gradient_accumulation_steps` mini-batches per optimizer step,
clipping the gradient norm at `grpo.max_grad_norm`. Old log-probs are recorded
once per generation, so epochs after the first are importance-weighted.

This module adds what is specific to text: loading the model (optionally with
LoRA), prompt datasets, a learning-rate schedule, held-out evaluation at the
start, every `evaluation.every` steps and at the end, metrics, and saving.

Choices (departures from seed 001 and seed 004's defaults):
- The schedule advances once per GRPO step (one generation batch), so
  `warmup_steps` and `num_steps` count generation batches, not optimizer steps.
- The reference policy is fixed for the whole run (`ref_update_frequency=0`),
  as in seed 001; with LoRA it is the base model with adapters disabled.
- μ defaults to 1 (one gradient pass per generation, as most text GRPO runs do)
  and the entropy bonus to 0.

Metrics per step (besides the trainer's): "completion/length_mean|max",
"completion/truncated_frac", "completion/eos_frac", "entropy/rollout_mean",
"rewards/<fn>/mean|std", "reward/positive_frac", "reward/start",
"reward/change" (now minus start), "loss/kl_share" = |KL term| / (|policy
term| + |KL term|) (seed 001's "KL penalty ratio"), "lr". Evaluation records
hold "eval/<mode>/reward_mean", "eval/<mode>/accuracy", ... and
"eval/samples" (a list of dicts, the one non-scalar entry).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo.config import GRPOConfig
from grpo.data import PromptSampler, check_prompt_lengths, load_prompts
from grpo.evaluation import MODES, evaluate
from grpo.policies.causal_lm import CausalLMPolicy, CausalLMSettings
from grpo.policies.loading import LoraSettings, is_peft_model
from grpo.rewards.combine import TextReward
from grpo.trainer import GRPOTrainer

__all__ = ["EvalConfig", "ScheduleConfig", "TextGRPOConfig", "TextGRPOTrainer", "SCHEDULERS"]

log = logging.getLogger("grpo")

# our schedule names -> transformers.get_scheduler names (all take a warm-up)
SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def _positive_int(owner: str, name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name}: got {value!r}; allowed: an integer >= {minimum}")


@dataclass
class ScheduleConfig:
    """Optimiser and learning-rate schedule."""

    num_steps: int = 100
    """GRPO steps (generation batches of B prompts x G completions)."""
    learning_rate: float = 1e-6
    """Peak AdamW learning rate (seed 001 found 1e-6 for full fine-tuning)."""
    lr_scheduler: str = "constant"
    """Shape after warm-up: a key of `SCHEDULERS` (constant, linear or cosine decay to 0)."""
    warmup_steps: int = 0
    """GRPO steps of linear warm-up from 0 to learning_rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""

    def __post_init__(self) -> None:
        _positive_int("schedule", "num_steps", self.num_steps)
        _positive_int("schedule", "warmup_steps", self.warmup_steps, minimum=0)
        if not isinstance(self.learning_rate, (int, float)) or not self.learning_rate > 0:
            raise ValueError(
                f"schedule.learning_rate: got {self.learning_rate!r}; allowed: a number > 0"
            )
        if self.lr_scheduler not in SCHEDULERS:
            raise ValueError(
                f"schedule.lr_scheduler: got {self.lr_scheduler!r}; allowed: {', '.join(SCHEDULERS)}"
            )
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            raise ValueError(
                f"schedule.weight_decay: got {self.weight_decay!r}; allowed: a number >= 0"
            )


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
        _positive_int("evaluation", "every", self.every, minimum=0)
        _positive_int("evaluation", "samples_per_prompt", self.samples_per_prompt)
        _positive_int("evaluation", "batch_size", self.batch_size)
        _positive_int("evaluation", "num_logged_samples", self.num_logged_samples, minimum=0)
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
        _positive_int("config", "prompts_per_step", self.prompts_per_step)
        _positive_int("config", "seed", self.seed, minimum=0)
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


def _as_sink(sink: Any) -> Callable[[dict[str, Any], int], None]:
    """A MetricsLogger (.log(metrics, step)), a callable f(metrics, step), a list, or None."""
    if sink is None:
        return lambda metrics, step: None
    if isinstance(sink, list):
        return lambda metrics, step: sink.append({"step": step, **metrics})
    if callable(getattr(sink, "log", None)):
        return sink.log
    if callable(sink):
        return sink
    raise TypeError(
        f"sink: got {type(sink).__name__}; allowed: a metrics logger, a callable, a list or None"
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
        self.sink = _as_sink(sink)
        self.sampler = PromptSampler(self.train_prompts, config.prompts_per_step, seed=config.seed)
        schedule = config.schedule
        params = list(self.policy.get_parameters().values())
        self.optimizer = torch.optim.AdamW(
            params, lr=schedule.learning_rate, weight_decay=schedule.weight_decay
        )
        from transformers import get_scheduler

        self.scheduler = get_scheduler(
            SCHEDULERS[schedule.lr_scheduler],
            self.optimizer,
            num_warmup_steps=schedule.warmup_steps,
            num_training_steps=schedule.num_steps,
        )
        grpo = config.grpo
        if is_peft_model(self.policy.model) and grpo.kl_coeff > 0 and grpo.ref_update_frequency > 0:
            warnings.warn(
                "with LoRA the reference is the base model (adapters disabled) and does not follow "
                f"ref_update_frequency={grpo.ref_update_frequency}",
                UserWarning,
                stacklevel=2,
            )
        self.trainer = GRPOTrainer(self.policy, self.reward, self.optimizer, grpo)
        self.history: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self.step = 0
        self._start_reward: float | None = None

    def _load_policy(self) -> CausalLMPolicy:
        c = self.config
        if c.model_path is None:
            raise ValueError("config.model_path: got None; give a model folder or pass policy=")
        return CausalLMPolicy.from_pretrained(
            c.model_path, c.policy, lora=c.lora, dtype=c.dtype, device=c.device
        )

    def train(self) -> list[dict[str, Any]]:
        """Evaluate, run every step (evaluating every k), evaluate, save; returns the step records."""
        total = self.config.schedule.num_steps
        every = self.config.evaluation.every
        self.evaluate()
        while self.step < total:
            self.train_step()
            if every and self.step % every == 0 and self.step < total:
                self.evaluate()
        self.evaluate()
        if self.config.output_dir is not None:
            self.policy.save_pretrained(self.config.output_dir, merged=self.config.save_merged)
        return self.history

    def train_step(self) -> dict[str, Any]:
        """One GRPO step on the next B prompts; returns (and logs) its metrics."""
        lr = self.optimizer.param_groups[0]["lr"]
        metrics = dict(self.trainer.train_step(next(self.sampler)))
        self.scheduler.step()
        self.step += 1
        metrics.update(self.policy.rollout_metrics)
        metrics.update(self.reward.last_metrics)
        if self._start_reward is None:
            self._start_reward = metrics["reward/mean"]
        metrics["reward/start"] = self._start_reward
        metrics["reward/change"] = metrics["reward/mean"] - self._start_reward
        if "loss/kl" in metrics:
            kl, pg = abs(metrics["loss/kl"]), abs(metrics.get("loss/policy", 0.0))
            metrics["loss/kl_share"] = kl / (kl + pg) if kl + pg > 0 else 0.0
        metrics["lr"] = lr
        self.history.append(metrics)
        self.sink(metrics, self.step)
        return metrics

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics now (empty when there are no eval prompts); logged with samples."""
        if self.eval_prompts is None:
            return {}
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
            log.info("step %d eval sample %s", self.step, sample)
        record = {**metrics, "eval/samples": samples}
        self.evaluations.append({"step": self.step, **record})
        self.sink(record, self.step)
        return record
