"""Tests for reading `grpo train` configs: every rejected case names its key, before any model loads."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from grpo.cli import main
from grpo.config import GRPOConfig
from grpo.run.config_files import load_config, merged_values, resolved_yaml
from grpo.run.presets import PRESETS
from grpo.run.structured import ConfigError, from_dict, to_dict

DEMO_MODEL = Path(__file__).resolve().parents[2] / "grpo" / "assets" / "arith-tiny"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def base(tmp_path: Path, extra: str = "") -> str:
    """A valid config around the shipped demo model, plus `extra` YAML lines."""
    return write(tmp_path, f"model: {{path: {DEMO_MODEL}}}\n" + textwrap.dedent(extra))


REJECTED = [
    ("grpo: {batch_sise: 8}", "unknown key grpo.batch_sise; allowed keys of grpo: group_size"),
    ("grpo: {group_size: eight}", "grpo.group_size: got 'eight'; allowed: an integer"),
    ("grpo: {clip_epsilon: [0.2]}", "grpo.clip_epsilon: got \\[0.2\\]; allowed: a number"),
    ("policy: {generation: {top_p: 1.5}}", "policy.generation: top_p: got 1.5"),
    ("grpo: {group_size: 4, batch_size: 10}", "grpo.batch_size: got 10, not a multiple of"),
    ("preset: dapo\ngrpo: {kl_coeff: 0.1}", "grpo.kl_coeff: got 0.1 with model.use_reference"),
    ("schedule: {lr_scheduler: step}", "schedule.lr_scheduler: got 'step'"),
    ("task: {name: sudoku}", "task.name: got 'sudoku'; allowed: arithmetic"),
    ("task: {name: prompts}", "task.train_file: got null"),
    ("preset: ppo", "preset: got 'ppo'; allowed: grpo, dr_grpo, dapo, reinforce, chess"),
    ("evaluation: {modes: [beam]}", "evaluation.modes: got 'beam'"),
    ("unknown_section: {a: 1}", "unknown key unknown_section; allowed keys: preset, model"),
    (
        "rollout: {engine: sglang}",
        "rollout.engine: got 'sglang'; allowed: transformers, lean, vllm",
    ),
    ("rollout: {vllm: {tis_cap: 0.5}}", "rollout.vllm.tis_cap: got 0.5"),
    ("task: {rewards: {correct: 3}}", "task.rewards.correct: got 3; allowed: a string"),
    ("task: {rewards: {correct: nocolon}}", "task.rewards.correct: function: got 'nocolon'"),
    ("task: {rewards: [{function: nocolon}]}", "task.rewards\\[0\\]: function: got 'nocolon'"),
    ("task: {rewards: 3}", "task.rewards: got 3; allowed: a list of .* or a mapping"),
    ("grpo: {learning_rate: 0.001}", "grpo.learning_rate: .* set schedule.learning_rate"),
    (
        "policy: {chunked_output_layer: sometimes}",
        "chunked_output_layer: got 'sometimes'; allowed: true, false or 'auto'",
    ),
    (
        "policy: {chunked_output_layer: true}\ndistributed: {strategy: fsdp2}",
        "policy.chunked_output_layer: got true with distributed.strategy=fsdp2",
    ),
]


@pytest.mark.parametrize(("extra", "message"), REJECTED)
def test_each_rejected_case_names_its_key(tmp_path, extra, message):
    """A bad key, type, value or combination raises ConfigError naming the dotted key."""
    with pytest.raises(ConfigError, match=message):
        load_config(base(tmp_path, extra))


def test_missing_model_path_is_rejected(tmp_path):
    """model.path that is absent or not a folder is an error naming model.path."""
    with pytest.raises(ConfigError, match="model.path: got null"):
        load_config(write(tmp_path, "task: {name: arithmetic}"))
    with pytest.raises(ConfigError, match="model.path: '/no/such/model' is not a folder"):
        load_config(write(tmp_path, "model: {path: /no/such/model}"))


def test_cli_rejects_a_bad_config_before_loading_any_model(tmp_path, monkeypatch, capsys):
    """`grpo train` exits 2 with the key in one line, and never reaches model loading."""
    import grpo.cli.tasks

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded for a rejected config")

    monkeypatch.setattr(grpo.cli.tasks, "load_policy", no_loading)
    path = base(tmp_path, "grpo: {group_size: 4, batch_size: 6}")
    assert main(["train", path, "--set", f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpo train: error: grpo.batch_size: got 6")
    assert not (tmp_path / "run").exists()


def test_set_overrides_parse_yaml_values_and_win(tmp_path):
    """--set a.b=c overrides file and preset, with YAML typing of the value."""
    path = base(tmp_path, "preset: grpo\ngrpo: {kl_coeff: 0.2}")
    config = load_config(path, ["grpo.kl_coeff=0.05", 'policy.generation.stop_strings=["\\n"]'])
    assert config.grpo.kl_coeff == 0.05 and config.grpo.loss_type == "clipped"
    assert config.policy.generation.stop_strings == ("\n",)
    with pytest.raises(ConfigError, match="--set 'grpo.kl_coeff': expected KEY=VALUE"):
        load_config(path, ["grpo.kl_coeff"])
    assert config.run.dir == str(Path("runs") / "run")  # defaulted from the file name


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_resolve_to_their_documented_values(tmp_path, name):
    """Each preset yields a valid config carrying its values; the file can still override them."""
    config = load_config(base(tmp_path, f"preset: {name}"))
    values = PRESETS[name].values
    for key, value in values.get("grpo", {}).items():
        assert getattr(config.grpo, key) == value
    if name == "dr_grpo":  # its denominator defaults to the sampler's longest completion
        assert config.grpo.max_completion_length == config.policy.generation.max_new_tokens
        assert config.grpo.advantage_scale == "none"
    if name == "reinforce":
        assert config.grpo.loss_type == "reinforce" and not config.model.use_reference
    if name == "chess":
        assert (config.task.name, config.grpo.group_size, config.schedule.learning_rate) == (
            "chess", 4, 1e-6)  # fmt: skip
        assert config.policy.generation.temperature == 0.5
        assert config.policy.generation.top_p == 0.9
    overridden = load_config(base(tmp_path, f"preset: {name}\ngrpo: {{clip_epsilon: 0.1}}"))
    assert overridden.grpo.clip_epsilon == 0.1


def test_resolved_config_reloads_to_the_same_config(tmp_path):
    """config.yaml written for a run loads back to an equal config (what --resume relies on)."""
    config = load_config(base(tmp_path, "preset: dapo\nprompts_per_step: 4"))
    text = resolved_yaml(config)
    again = load_config(write(tmp_path, text, "resolved.yaml"))
    assert to_dict(again) == to_dict(config)
    assert yaml.safe_load(text)["grpo"]["clip_epsilon_high"] == 0.28


def test_from_dict_converts_lists_to_tuples_and_ints_to_floats():
    """Typed mapping: tuple fields take lists, float fields take ints, __post_init__ still runs."""
    config = from_dict(GRPOConfig, {"clip_epsilon": 1, "group_size": 3})
    assert config.clip_epsilon == 1.0 and isinstance(config.clip_epsilon, float)
    with pytest.raises(ConfigError, match="group_size must be an integer >= 2"):
        from_dict(GRPOConfig, {"group_size": 1}, "grpo")


def test_interpolation_is_resolved(tmp_path):
    """${...} references between keys are resolved by the YAML layer."""
    values = merged_values(
        base(tmp_path, "grpo: {group_size: 6, batch_size: '${grpo.group_size}'}")
    )
    assert values["grpo"]["batch_size"] == 6


def test_rewards_mapping_is_the_list_of_named_functions_of_weight_1(tmp_path):
    """task.rewards {name: function} loads as [{function, weight: 1, name}], in order."""
    from grpo.cli.tasks import _reward_functions
    from grpo.run.config import RewardSpec

    (tmp_path / "rewards.py").write_text(
        "def correct(prompts, completions, **columns):\n    return [1.0] * len(completions)\n"
    )
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1="}\n')
    fn = f"{tmp_path / 'rewards.py'}:correct"
    task = f"task: {{name: prompts, train_file: {tmp_path / 'train.jsonl'}, rewards: "
    mapping = load_config(base(tmp_path, task + f"{{right: '{fn}', also: '{fn}'}}}}"))
    entries = f"[{{function: '{fn}', name: right}}, {{function: '{fn}', name: also}}]"
    listed = load_config(base(tmp_path, task + entries + "}"))
    expected = [RewardSpec(fn, 1.0, "right"), RewardSpec(fn, 1.0, "also")]
    assert mapping.task.rewards == listed.task.rewards == expected
    reward = _reward_functions(mapping.task.rewards)
    assert reward.weights == {"right": 1.0, "also": 1.0}
    again = load_config(write(tmp_path, resolved_yaml(mapping), "resolved.yaml"))
    assert again.task.rewards == expected  # a run directory's config.yaml holds the list form
