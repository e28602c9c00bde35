"""What a run trains: `TaskParts` (policy, reward, states, evaluation), and text parts.

Every run, from `grpo train` or from `grpo.TextTrainer`, is a `TaskParts`
handed to `grpo.run.train.train`. `text_parts` builds the parts of a
single-turn text task from a causal-LM policy, a `TextReward` and prompt
datasets; the built-in tasks of the command line (`grpo.cli.tasks`) and the
Python entry point both use it, so both run exactly the same loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo.licence import ModelLicence
from grpo.run.config import RunConfig

__all__ = ["TaskParts", "load_policy", "load_text_data", "resolve_device", "text_parts"]

Evaluator = Callable[[], tuple[dict[str, float], list[dict[str, Any]]]]

@dataclass
class TaskParts:
    """What a task gives the training loop."""

    policy: Any
    """The `PolicyModel` to train."""
    reward: Any
    """The `RewardModel` scoring its actions."""
    train_states: Sequence[Any]
    """States drawn prompts_per_step at a time (reshuffled every pass)."""
    evaluate: Evaluator | None = None
    """() -> (held-out metrics "eval/...", a few sample dicts); None = no evaluation."""
    headline: tuple[str, ...] = ()
    """Evaluation keys listed first in the before/after table."""
    save: Callable[[Path], Any] | None = None
    """Writes the trained model to a folder (Hugging Face format for causal LMs)."""
    grad_scaler: Any = None
    """A `torch.amp.GradScaler` for fp16 mixed precision; None = no loss scaling."""
    licence: ModelLicence | None = None
    """The licence files the trained model's source folder declares (`grpo.licence`): every
    checkpoint carries them (`save` writes them into the final model). None: the policy's own
    `licence`, if it has one (a task factory of your own need not pass it)."""

    def __post_init__(self) -> None:
        if self.licence is None:
            self.licence = getattr(self.policy, "licence", None)


def resolve_device(device: str) -> str:
    """ "auto" -> the GPU of this process when there is one, else the CPU."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def load_policy(config: RunConfig) -> Any:
    """The causal-LM policy of `config.model` and `config.policy`."""
    from grpo.lm.policy import CausalLMPolicy  # only text runs need transformers

    m = config.model
    return CausalLMPolicy.from_pretrained(
        m.path, config.policy, lora=m.lora, dtype=m.dtype, device=resolve_device(m.device),
        rollout=config.rollout, freeze=tuple(m.freeze),
    )  # fmt: skip


def load_text_data(reward, train, held_out, accuracy) -> tuple[list, list | None]:
    """Train and held-out prompt records, each row checked for the columns the reward
    functions (and, held out, the accuracy function) require; no model needed."""
    from grpo.run.data import check_reward_columns, load_prompts

    train = load_prompts(train, name="train prompts")
    check_reward_columns(train, reward)
    held_out = load_prompts(held_out, name="held-out prompts") if held_out else None
    if held_out:
        check_reward_columns(held_out, reward, accuracy)
    return train, held_out


def text_parts(
    config, policy, reward, train, held_out, accuracy, headline, breakdown=None
) -> TaskParts:
    """Parts of a single-turn text task: evaluation as in `grpo.run.evaluation.evaluate`, with
    the task's own `breakdown(states, texts)` metrics and, for `evaluation.reference_kl`, the KL
    to a frozen copy of the policy made now, before any training.
    Every row is checked before training: its columns, and its length against the context."""
    from grpo.run.data import check_prompt_lengths
    from grpo.run.evaluation import evaluate

    train, held_out = load_text_data(reward, train, held_out, accuracy)
    check_prompt_lengths(train, policy, name="train prompts")
    if held_out:
        check_prompt_lengths(held_out, policy, name="held-out prompts")
    e = config.evaluation
    reference = policy.make_reference() if e.reference_kl and held_out else None

    def run_evaluation():
        return evaluate(
            policy, held_out, reward, accuracy=accuracy, modes=e.modes,
            samples_per_prompt=e.samples_per_prompt, batch_size=e.batch_size,
            num_logged_samples=e.num_logged_samples, breakdown=breakdown, reference=reference,
            kl_estimator=config.grpo.kl_estimator,
        )  # fmt: skip

    def save(path: Path) -> None:
        policy.save_pretrained(str(path), merged=config.model.save_merged)

    scaler = None  # fp16 gradients can underflow: scale the loss
    if config.policy.precision == "fp16-mixed":
        scaler = torch.amp.GradScaler(policy.device.type)
    evaluation = run_evaluation if held_out else None
    return TaskParts(policy, reward, train, evaluation, headline, save, scaler, policy.licence)
