"""`TextTrainer`: GRPO on a causal language model with reward functions over text, from Python.

    from grpo import TextTrainer

    trainer = TextTrainer(
        "grpo/assets/arith-tiny",            # a folder written by save_pretrained, or a model
        rewards=[correct_answer],            # reward(prompts, completions, **columns) -> list
        train_dataset="train.jsonl",         # a list of rows, a JSONL path or a datasets.Dataset
        eval_dataset="test.jsonl",
        config="configs/demo.yaml",          # a YAML file, a dict of sections or a RunConfig
    )
    summary = trainer.train()                # trainer.train(resume=True) continues a run

It builds exactly what `grpo train` builds from the same config (the same
`grpo.run.train.train`: seeding, data-parallel under torchrun, checkpoints,
resume, run directory, final model), with the dataset and rewards given here
in place of the config's `task` section. The same seed gives the same
parameters, bit for bit, as the command line on the same data.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo.rewards.combine import TextReward
from grpo.run.config import RunConfig
from grpo.run.config_files import load_config
from grpo.run.data import check_reward_columns, load_prompts
from grpo.run.parts import TaskParts, load_policy, text_parts
from grpo.run.structured import ConfigError
from grpo.run.train import train

__all__ = ["TextTrainer"]


class TextTrainer:
    """A `grpo train` run on your own prompts and reward functions."""

    def __init__(
        self,
        model: str | os.PathLike[str] | Any,
        rewards: TextReward | Callable[..., Any] | Sequence[Callable[..., Any]] | Mapping,
        train_dataset: Any,
        eval_dataset: Any = None,
        *,
        config: str | os.PathLike[str] | Mapping[str, Any] | RunConfig | None = None,
        overrides: Sequence[str] = (),
        accuracy: Callable[..., Sequence[Any]] | None = None,
        tokenizer: Any = None,
    ) -> None:
        """`model`: a local model folder, or a transformers causal LM object (then give its
        `tokenizer`; the object itself is trained, so a second `train()` continues from where
        the first left it, and the config's model.lora, model.freeze, model.dtype and
        model.device, which apply to a folder as it loads, must be left unset: set the object
        up before, with `grpo.lm.loading.apply_lora` and `freeze_parameters` and its own
        `.to()`). `rewards`: a `TextReward`, one reward function, a list of them, or a dict
        name -> function (summed with weight 1). `config`: the run's settings, as `grpo train`
        reads them (`overrides` are `--set` items, e.g. "schedule.num_steps=10"); its `task`
        section is not used. `accuracy`: optional function scoring 1 = correct, the headline of
        the held-out evaluation."""
        self.config = _run_config(config, overrides, model)
        self.reward = rewards if isinstance(rewards, TextReward) else TextReward(rewards)
        # read and checked now, before any run directory or model exists
        self.train_dataset = load_prompts(train_dataset, name="train_dataset")
        self.eval_dataset = (
            None if eval_dataset is None else load_prompts(eval_dataset, name="eval_dataset")
        )
        self.accuracy = accuracy
        check_reward_columns(self.train_dataset, self.reward)
        if self.eval_dataset is not None:
            check_reward_columns(self.eval_dataset, self.reward, accuracy)
        self._model = None if isinstance(model, (str, os.PathLike)) else model
        self._tokenizer = tokenizer
        if self._model is not None and tokenizer is None:
            raise ValueError("tokenizer: got None with a model object; allowed: its tokenizer")
        if self._model is not None:
            _check_object_settings(self.config)
        self.parts: TaskParts | None = None
        """The policy, reward, states and evaluation of the run, once `train` has built them."""

    def build_parts(self, config: RunConfig) -> TaskParts:
        """The run's parts: called by `train` after seeding, as the command line's tasks are."""
        if self._model is None:
            policy = load_policy(config)
        else:
            from grpo.lm.policy import CausalLMPolicy

            policy = CausalLMPolicy(self._model, self._tokenizer, config.policy, config.rollout)
        score = "accuracy" if self.accuracy is not None else "reward_mean"
        headline = tuple(f"eval/{mode}/{score}" for mode in config.evaluation.modes)
        self.parts = text_parts(
            config, policy, self.reward, self.train_dataset, self.eval_dataset, self.accuracy,
            headline,
        )  # fmt: skip
        return self.parts

    def train(self, *, resume: bool = False) -> dict[str, Any]:
        """Run to the end (`resume`: continue the run in `config.run.dir` from its last
        checkpoint); returns the summary: the first and last evaluations, steps, seconds."""
        return train(copy.deepcopy(self.config), self.build_parts, resume=resume)


def _check_object_settings(config: RunConfig) -> None:
    """Refuse model settings that only a folder's loading applies, given a model object."""
    m = config.model
    unset = {"lora": (m.lora, None), "freeze": (m.freeze, []), "dtype": (m.dtype, "auto"),
             "device": (m.device, "auto")}  # fmt: skip
    for name, (value, default) in unset.items():
        if value != default:
            raise ConfigError(
                f"model.{name}: got {value!r} with a model object; it applies to a model loaded "
                f"from a folder: leave it {default!r} and set the object up before passing it"
            )


def _run_config(
    config: str | os.PathLike[str] | Mapping[str, Any] | RunConfig | None,
    overrides: Sequence[str],
    model: Any,
) -> RunConfig:
    """The checked RunConfig, its model path set from `model` when that is a folder."""
    if isinstance(config, RunConfig):
        if overrides:
            raise ConfigError("overrides: give them inside the RunConfig, or pass a dict or a file")
        config = copy.deepcopy(config)
    else:
        path = [f"model.path={os.fspath(model)}"] if isinstance(model, (str, os.PathLike)) else []
        config = load_config(config, [*overrides, *path], builtin_task=False)
        if config.run.dir == "runs/run":
            config.run.dir = "runs/text"
    if isinstance(model, (str, os.PathLike)):
        config.model.path = os.fspath(model)
        if not os.path.isdir(config.model.path):
            raise FileNotFoundError(
                f"model: {config.model.path!r} does not exist or is not a folder; allowed: a "
                "local folder written by save_pretrained"
            )
    return config
