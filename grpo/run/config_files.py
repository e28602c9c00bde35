"""Reading a run's configuration: preset < YAML file < `--set key=value`, checked strictly.

OmegaConf parses and merges (YAML, dotted overrides, `${...}` interpolation);
`grpo.run.structured.from_dict` then builds the dataclasses, so an unknown
key, a wrong type or a value out of range is rejected with the dotted key
named, before any model is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo.run.config import TEXT_GRPO_DEFAULTS, RunConfig, check_combinations
from grpo.run.presets import PRESETS
from grpo.run.structured import ConfigError, from_dict, to_dict

__all__ = ["BUILTIN_TASKS", "RUN_DEFAULTS", "load_config", "merged_values", "resolved_yaml"]

BUILTIN_TASKS = ("arithmetic", "chess", "guess_number", "word_problems", "prompts")

RUN_DEFAULTS = {
    "seed": 0,
    "grpo": {**TEXT_GRPO_DEFAULTS, "seed": "${seed}"},
    "policy": {"generation": {"seed": "${seed}"}},
}
"""The lowest layer of every run's config: where it departs from the dataclasses' defaults
(language-model choices for the trainer; one `seed` driving every RNG unless a section names
its own)."""


def _read(path: str | os.PathLike[str]) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        values = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from err
    if not isinstance(OmegaConf.to_container(values), dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections")
    return values


def _dotlist(overrides: Sequence[str]) -> Any:
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. grpo.kl_coeff=0.1")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise ConfigError(f"--set: {err}") from err


def merged_values(
    source: str | os.PathLike[str] | Mapping[str, Any] | None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """The plain nested dict of run defaults, preset, `source` (a YAML file or a mapping of
    sections) and overrides, merged in that order."""
    if isinstance(source, Mapping):
        layers = [OmegaConf.create(dict(source))]
    else:
        layers = [_read(source)] if source is not None else []
    layers.append(_dotlist(overrides))
    top = OmegaConf.to_container(OmegaConf.merge(*layers), resolve=False)
    preset = top.get("preset")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"preset: got {preset!r}; allowed: {', '.join(PRESETS)}")
        layers.insert(0, OmegaConf.create(PRESETS[preset].values))
    layers.insert(0, OmegaConf.create(RUN_DEFAULTS))
    try:
        values = OmegaConf.to_container(OmegaConf.merge(*layers), resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"config: {err}") from err
    _fill_constant_length(values)
    grpo = values.get("grpo")
    if isinstance(grpo, Mapping) and "learning_rate" in grpo:
        raise ConfigError(
            "grpo.learning_rate: a run's optimizer takes its rate from the schedule; "
            "allowed: set schedule.learning_rate instead"
        )
    return values


def _fill_constant_length(values: dict[str, Any]) -> None:
    """Dr. GRPO's denominator defaults to the longest completion the sampler may produce."""
    grpo = values.get("grpo")
    if isinstance(grpo, Mapping) and grpo.get("aggregation") == "constant_length":
        generation = values.get("policy", {}).get("generation", {})
        if grpo.get("max_completion_length") is None and isinstance(generation, Mapping):
            grpo["max_completion_length"] = generation.get("max_new_tokens", 256)


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | None,
    overrides: Sequence[str] = (),
    *,
    builtin_task: bool | None = None,
) -> RunConfig:
    """The checked `RunConfig` of a YAML file (or a mapping of sections) plus overrides; the
    run directory defaults to runs/<file name>. `builtin_task` None: judged from task.name."""
    config = from_dict(RunConfig, merged_values(source, overrides))
    if config.run.dir is None:
        stem = Path(source).stem if isinstance(source, (str, os.PathLike)) else "run"
        config.run.dir = str(Path("runs") / stem)
    name = config.task.name
    if builtin_task is None and name not in BUILTIN_TASKS and ":" not in name:
        raise ConfigError(
            f"task.name: got {name!r}; allowed: {', '.join(BUILTIN_TASKS)} or "
            "'module:function' / 'file.py:function' for your own task"
        )
    try:
        builtin = name in BUILTIN_TASKS if builtin_task is None else builtin_task
        check_combinations(config, builtin_task=builtin)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return config


def resolved_yaml(config: RunConfig) -> str:
    """The full config, every default filled in, as YAML (what a run directory records).
    grpo.learning_rate is left out: a run rejects it (the rate is schedule.learning_rate)."""
    values = to_dict(config)
    values["grpo"].pop("learning_rate", None)
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True)
