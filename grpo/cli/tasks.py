"""Tasks for `grpo train`: each builds the policy, reward, training states and evaluation.

`TASKS` maps a `task.name` to a builder `RunConfig -> TaskParts`:
- "arithmetic", "chess", "word_problems": single-turn text tasks from `grpo.tasks`
  (seeded train and held-out splits, exact rewards, accuracy or reward as the headline;
  word problems are held out twice, by numbers and by phrasing, each evaluated apart);
- "guess_number": a multi-turn game played through `grpo.envs` (the policy's
  actions are whole episodes);
- "prompts": your JSONL prompt files and reward functions named by import path.
"word_problems" and "prompts" take `task.options.prompt_form`: chat messages through the
chat template, or as plain text for a base model (`grpo.lm.prompt_forms`).
Any other name of the form "module:function" or "path/file.py:function" is a
factory of your own with the same signature, for policies that are not causal
LMs (the fill-in example does this).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo.lm.prompt_forms import check_chat_template, check_prompt_form, in_form, stop_strings_for
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


def _without_reference_kl(config: RunConfig) -> None:
    """Tasks whose evaluation is not `text_parts`' refuse `evaluation.reference_kl`."""
    if config.evaluation.reference_kl:
        raise ConfigError(
            f"evaluation.reference_kl: not supported by task {config.task.name!r}; allowed: "
            "false (arithmetic, chess and prompts support it)"
        )


def _form_policy(config: RunConfig, form: str, rows: Sequence[dict]) -> Any:
    """The policy, loaded after the plain form's stop string joins
    policy.generation.stop_strings (so the run's config.yaml records it); a ConfigError naming
    task.options.prompt_form when chat messages meet a tokenizer without a chat template."""
    g = config.policy.generation
    stop = stop_strings_for(form, g.stop_strings)
    if stop != g.stop_strings:
        config.policy.generation = g.replace(stop_strings=stop)
    policy = load_policy(config)
    prompts = (row["prompt"] for row in rows)
    try:
        check_chat_template("task.options.prompt_form", form, policy.tokenizer, prompts)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return policy


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
    extra_names = ("min_plies", "max_plies", "prompt", "supervised_fraction")
    if "piece" in t.options:
        raise ConfigError("task.options.piece: set by task.options.prompt (grpo.tasks.chess)")
    settings, extra = _options(chess.ChessRewardConfig, t.options, extra_names)
    prompt = extra.pop("prompt", "fen")
    if prompt not in chess.PROMPTS:
        raise ConfigError(
            f"task.options.prompt: got {prompt!r}; allowed: {', '.join(chess.PROMPTS)}"
        )
    settings = dataclasses.replace(settings, piece=chess.PROMPT_PIECE.get(prompt))
    train = chess.generate_dataset(t.train_size, split="train", seed=t.seed, prompt=prompt, **extra)
    held = chess.generate_dataset(t.eval_size, split="held_out", seed=0, prompt=prompt, **extra)
    reward = TextReward({"chess_moves": chess.make_reward(settings)})
    headline = tuple(
        f"eval/{mode}/{key}"
        for mode in config.evaluation.modes
        for key in ("reward_mean", "precision", "coverage")
    )
    breakdown = functools.partial(chess.breakdown, piece=settings.piece)
    return text_parts(config, load_policy(config), reward, train, held, None, headline, breakdown)


def _word_problems(config: RunConfig) -> TaskParts:
    from grpo.rewards.combine import TextReward
    from grpo.tasks import word_problems as wp

    _without_reference_kl(config)
    t = config.task
    settings, extra = _options(wp.WordProblemsConfig, t.options, ("answer_check", "format_weight"))
    check_name = extra.get("answer_check", "integer")
    if check_name not in wp.ANSWER_CHECKS:
        raise ConfigError(
            f"task.options.answer_check: got {check_name!r}; allowed: {', '.join(wp.ANSWER_CHECKS)}"
        )
    if check_name == "math_verify" and importlib.util.find_spec("math_verify") is None:
        raise ConfigError(
            "task.options.answer_check: math_verify needs the math-verify package: "
            "pip install 'grpo[math]' (or use answer_check: integer)"
        )
    check = wp.ANSWER_CHECKS[check_name]
    format_weight = extra.get("format_weight", 0.1)
    if isinstance(format_weight, bool) or not isinstance(format_weight, (int, float)):
        raise ConfigError(f"task.options.format_weight: got {format_weight!r}; allowed: a number")
    functions, weights = {"correct": check}, [1.0]
    if format_weight:
        functions["answer_format"], weights = wp.answer_format, [1.0, float(format_weight)]
    reward = TextReward(functions, weights)
    train = wp.generate_dataset(t.train_size, split="train", seed=t.seed, config=settings)
    held = {
        split: wp.generate_dataset(t.eval_size, split=split, seed=0, config=settings)
        for split in wp.SPLITS[1:]
    }
    # both held-out splits checked (columns, prompt lengths) as one set, evaluated separately
    every_held = [row for rows in held.values() for row in rows]
    policy = _form_policy(config, settings.prompt_form, [*train, *every_held])
    parts = text_parts(config, policy, reward, train, every_held, check, ())
    modes = config.evaluation.modes
    headline = tuple(
        f"eval/{split}{mode}/{key}"
        for mode in modes
        for split in ("", *(f"{split}/" for split in wp.SPLITS[1:]))
        for key in ("accuracy", "accuracy_strict")
    )
    evaluate = _split_evaluation(config, parts.policy, reward, held, check, wp.breakdown)
    return dataclasses.replace(parts, evaluate=evaluate if t.eval_size else None, headline=headline)


def _split_evaluation(config, policy, reward, held, accuracy, breakdown) -> Callable:
    """An evaluator over several named held-out sets: "eval/<split>/<mode>/..." for each, and
    all of them pooled under "eval/<mode>/...": the task's `breakdown` over every split's rows
    at once (so its counts, accuracies and clustered standard error are those of the pooled
    set), the other metrics as means weighted by each split's problems (`_pooled`)."""
    from grpo.run.evaluation import evaluate

    e = config.evaluation

    def run_evaluation():
        metrics: dict[str, float] = {}
        samples: list[dict] = []
        scored = {mode: ([], []) for mode in e.modes}  # mode -> (every row, every completion)
        for split, rows in held.items():
            calls = []  # one (rows, completions) per mode, in the order of e.modes

            def recording(states, texts, calls=calls):
                calls.append((states, texts))
                return breakdown(states, texts)

            found, shown = evaluate(
                policy, rows, reward, accuracy=accuracy, modes=e.modes,
                samples_per_prompt=e.samples_per_prompt, batch_size=e.batch_size,
                num_logged_samples=e.num_logged_samples, breakdown=recording,
            )  # fmt: skip
            for mode, (states, texts) in zip(e.modes, calls, strict=True):
                scored[mode][0].extend(states)
                scored[mode][1].extend(texts)
            metrics |= {f"eval/{split}/{k.removeprefix('eval/')}": v for k, v in found.items()}
            samples += [{"split": split, **sample} for sample in shown]
        pooled = {f"eval/{mode}/{k}": v for mode, (states, texts) in scored.items()
                  for k, v in breakdown(states, texts).items()}  # fmt: skip
        sizes = {split: len(rows) for split, rows in held.items()}
        return metrics | _pooled(metrics, sizes, skip=pooled) | pooled, samples

    return run_evaluation


def _pooled(metrics: dict[str, float], sizes: dict[str, int], skip=()) -> dict[str, float]:
    """"eval/<split>/<mode>/<key>" of every split -> "eval/<mode>/<key>" of all together: a mean
    weighted by each split's problems, for each key not in `skip` (a spread does not pool as a
    mean: "/std" keys are left out)."""
    pooled: dict[str, float] = {}
    keys = {k.split("/", 2)[2] for k in metrics if k.split("/")[1] in sizes}
    for key in sorted(keys):
        if f"eval/{key}" in skip or key.endswith("/std"):
            continue
        found = [(sizes[s], metrics[f"eval/{s}/{key}"]) for s in sizes if f"eval/{s}/{key}" in metrics]
        total = sum(w for w, _ in found)
        pooled[f"eval/{key}"] = sum(w * v for w, v in found) / total
    return pooled


def _guess_number(config: RunConfig) -> TaskParts:
    from grpo.envs.agent import EpisodePolicy, EpisodeReward, PolicyAgent
    from grpo.tasks import guess_number as game

    _without_reference_kl(config)
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
    headline = ("eval/greedy/solve_rate",)
    return TaskParts(policy, EpisodeReward(), train, evaluate, headline, save, licence=lm.licence)


def _prompts(config: RunConfig) -> TaskParts:
    t = config.task
    unknown = sorted(set(t.options) - {"prompt_form"})
    if unknown:
        raise ConfigError(f"task.options.{unknown[0]}: unknown option; allowed: prompt_form")
    try:
        form = check_prompt_form("task.options.prompt_form", t.options.get("prompt_form", "chat"))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    reward = _reward_functions(t.rewards)
    accuracy = import_object(t.accuracy, "task.accuracy") if t.accuracy else None
    if accuracy is not None and not callable(accuracy):
        raise ConfigError(
            f"task.accuracy: {t.accuracy!r} is {type(accuracy).__name__}; allowed: a function"
        )
    # every row read and checked against the reward functions before the model loads
    train, held_out = load_text_data(reward, t.train_file, t.eval_file, accuracy)
    rows = [*train, *(held_out or ())]
    for row in rows:  # in place: each record keeps the line it was read from
        try:
            row["prompt"] = in_form(row["prompt"], form)
        except ValueError as err:
            raise ConfigError(f"task.options.prompt_form plain: {row.source}: {err}") from err
    headline = tuple(
        f"eval/{mode}/{'accuracy' if accuracy else 'reward_mean'}"
        for mode in config.evaluation.modes
    )
    policy = _form_policy(config, form, rows)
    return text_parts(config, policy, reward, train, held_out, accuracy, headline)


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
    "word_problems": _word_problems,
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
