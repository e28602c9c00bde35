"""Tasks for `grpo train`: each builds the policy, reward, training states and evaluation.

`TASKS` maps a `task.name` to a builder `RunConfig -> TaskParts`:
- "arithmetic", "chess": single-turn text tasks from `grpo.tasks` (seeded train
  and held-out splits, exact rewards, accuracy or reward as the headline);
- "guess_number": a multi-turn game played through `grpo.envs` (the policy's
  actions are whole episodes);
- "prompts": your JSONL prompt files and reward functions named by import path.
Any other name of the form "module:function" or "path/file.py:function" is a
factory of your own with the same signature, for policies that are not causal
LMs (the fill-in example does this).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo.run.config import RunConfig
from grpo.run.parts import TaskParts, load_policy, load_text_data, text_parts
from grpo.run.structured import ConfigError

__all__ = ["TASKS", "build_task", "import_object"]

def _options(kind: type, options: dict[str, Any], extra: Sequence[str] = ()) -> tuple[Any, dict]:
    """(kind(**known options), the named extra options); unknown keys are an error."""
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(options) - known - set(extra))
    if unknown:
        raise ConfigError(
            f"task.options.{unknown[0]}: unknown option; allowed: "
            f"{', '.join(sorted(known | set(extra)))}"
        )
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in options.items() if k in known}
    try:
        settings = kind(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"task.options: {err}") from err
    return settings, {k: options[k] for k in extra if k in options}


def _arithmetic(config: RunConfig) -> TaskParts:
    from grpo.rewards.combine import TextReward
    from grpo.tasks import arithmetic

    t = config.task
    settings, _ = _options(arithmetic.ArithmeticConfig, t.options)
    train = arithmetic.generate_dataset(t.train_size, split="train", seed=t.seed, config=settings)
    held = arithmetic.generate_dataset(t.eval_size, split="held_out", seed=0, config=settings)
    reward = TextReward({"correct": arithmetic.reward})
    modes = config.evaluation.modes
    headline = tuple(f"eval/{mode}/accuracy" for mode in modes)
    return text_parts(
        config, load_policy(config), reward, train, held, arithmetic.reward, headline
    )


def _chess(config: RunConfig) -> TaskParts:
    from grpo.rewards.combine import TextReward
    from grpo.tasks import chess

    t = config.task
    settings, plies = _options(chess.ChessRewardConfig, t.options, ("min_plies", "max_plies"))
    train = chess.generate_dataset(t.train_size, split="train", seed=t.seed, **plies)
    held = chess.generate_dataset(t.eval_size, split="held_out", seed=0, **plies)
    reward = TextReward({"chess_moves": chess.make_reward(settings)})
    headline = tuple(f"eval/{mode}/reward_mean" for mode in config.evaluation.modes)
    return text_parts(config, load_policy(config), reward, train, held, None, headline)


def _guess_number(config: RunConfig) -> TaskParts:
    from grpo.envs.agent import EpisodePolicy, EpisodeReward, PolicyAgent
    from grpo.tasks import guess_number as game

    t = config.task
    rules, extra = _options(game.GuessNumberConfig, t.options, ("max_turns",))
    max_turns = extra.get("max_turns", rules.max_guesses)
    lm = load_policy(config)
    policy = EpisodePolicy(
        lm, lambda secret: game.GuessNumberEnv(secret, rules), max_turns=max_turns
    )
    train = game.make_secrets(t.train_size, seed=t.seed, config=rules)
    held = game.make_secrets(t.eval_size, seed=t.seed + 1_000_000, config=rules)

    def run_evaluation():
        result = game.evaluate(PolicyAgent(lm, do_sample=False), held, rules)
        return {f"eval/greedy/{k}": v for k, v in result.items()}, []

    def save(path: Path) -> None:
        lm.save_pretrained(str(path), merged=config.model.save_merged)

    evaluate = run_evaluation if held else None
    return TaskParts(policy, EpisodeReward(), train, evaluate, ("eval/greedy/solve_rate",), save)


def _prompts(config: RunConfig) -> TaskParts:
    t = config.task
    reward = _reward_functions(t.rewards)
    accuracy = import_object(t.accuracy, "task.accuracy") if t.accuracy else None
    if accuracy is not None and not callable(accuracy):
        raise ConfigError(
            f"task.accuracy: {t.accuracy!r} is {type(accuracy).__name__}; allowed: a function"
        )
    # every row read and checked against the reward functions before the model loads
    train, held_out = load_text_data(reward, t.train_file, t.eval_file, accuracy)
    headline = tuple(
        f"eval/{mode}/{'accuracy' if accuracy else 'reward_mean'}"
        for mode in config.evaluation.modes
    )
    return text_parts(config, load_policy(config), reward, train, held_out, accuracy, headline)


def _reward_functions(specs: Sequence[Any]) -> Any:
    """The `TextReward` of task.rewards; a function that is not one is named by its key."""
    from grpo.rewards.combine import TextReward

    functions = {}
    for i, spec in enumerate(specs):
        key = f"task.rewards[{i}].function"
        fn = import_object(spec.function, key)
        name = spec.name or getattr(fn, "__name__", spec.function)
        try:
            TextReward({name: fn})  # callable, and callable as fn(prompts, completions, ...)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{key}: {spec.function!r}: {err}") from err
        functions[name] = fn
    if len(functions) != len(specs):
        raise ConfigError("task.rewards: two reward functions share a name; rename one")
    return TextReward(functions, [spec.weight for spec in specs])


TASKS: dict[str, Callable[[RunConfig], TaskParts]] = {
    "arithmetic": _arithmetic,
    "chess": _chess,
    "guess_number": _guess_number,
    "prompts": _prompts,
}


def import_object(spec: str, key: str) -> Any:
    """The object named by "package.module:name" or "path/to/file.py:name"."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{key}: got {spec!r}; allowed: 'module:name' or 'file.py:name'")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"{key}: {module_name!r} is not a file")
            sys.path.insert(0, str(path.parent))  # so the file can import its neighbours
            loaded = importlib.util.spec_from_file_location(f"grpo_user_{path.stem}", path)
            module = importlib.util.module_from_spec(loaded)
            sys.modules[loaded.name] = module  # dataclasses look their module up while it runs
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as err:  # a syntax error, or the file raised while it ran: the user's to fix
        message = " ".join(f"{type(err).__name__}: {err}".split())
        raise ConfigError(f"{key}: cannot import {module_name!r}: {message}") from err
    if not hasattr(module, attribute):
        raise ConfigError(f"{key}: {module_name!r} has no {attribute!r}")
    return getattr(module, attribute)


def build_task(config: RunConfig) -> TaskParts:
    """The parts of `config.task` (built-in by name, or a factory by import path)."""
    name = config.task.name
    builder = TASKS.get(name) or import_object(name, "task.name")
    try:
        parts = builder(config)
    except ConfigError:
        raise
    except (ValueError, FileNotFoundError) as err:  # bad data or model files: the user's to fix
        raise ConfigError(f"task {name!r}: {err}") from err
    if not isinstance(parts, TaskParts):
        raise ConfigError(
            f"task.name: {name!r} returned {type(parts).__name__}; allowed: grpo.run.parts.TaskParts"
        )
    return parts
