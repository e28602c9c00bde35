"""Tests for grpo.run.train: a run closes its policy (e.g. a vLLM engine) however it ends, and
passes the licence files its model folder declares on to every folder it saves."""

from __future__ import annotations

import shutil

import pytest
from toy_models import FunctionReward, TablePolicy, best_arm_reward

from grpo import TextTrainer
from grpo.licence import TRAINED, ModelLicence, read_licence, write_licence
from grpo.rewards.errors import RewardError
from grpo.run.config_files import load_config
from grpo.run.parts import TaskParts
from grpo.run.structured import ConfigError
from grpo.run.train import train


class ClosingPolicy(TablePolicy):
    """A bandit policy that counts `close` calls."""

    closed = 0

    def close(self) -> None:
        self.closed += 1


def _config(tmp_path, steps: int = 2):
    return load_config(
        {
            "task": {"name": "toy:bandit"},
            "prompts_per_step": 2,
            "grpo": {"group_size": 2, "batch_size": 4},
            "schedule": {"num_steps": steps},
            "run": {"dir": str(tmp_path / "run"), "tensorboard": False, "checkpoint_every": 0},
        },
        builtin_task=False,
    )


def _parts(policy, reward):
    return lambda config: TaskParts(policy, reward, train_states=[0, 1, 2, 3])


def test_a_finished_run_closes_its_policy_once(tmp_path):
    """After the last step, the policy's close hook has run exactly once."""
    policy = ClosingPolicy(4, 3)
    summary = train(_config(tmp_path), _parts(policy, best_arm_reward(4, 3)))
    assert summary["steps"] == 2 and policy.closed == 1


def test_a_failing_run_closes_its_policy_too(tmp_path):
    """A reward that breaks its contract stops the run; the policy is closed all the same."""
    policy = ClosingPolicy(4, 3)

    def broken(state, action):
        raise RewardError("broken on purpose")

    with pytest.raises(RewardError, match="broken on purpose"):
        train(_config(tmp_path), _parts(policy, FunctionReward(broken)))
    assert policy.closed == 1


def test_a_run_that_fails_to_build_closes_its_policy(tmp_path):
    """Parts the trainer refuses (a reward without the protocol) still get their policy closed."""
    policy = ClosingPolicy(4, 3)
    with pytest.raises(TypeError, match="RewardModel"):
        train(_config(tmp_path), _parts(policy, object()))
    assert policy.closed == 1


def test_declared_licence_files_reach_every_checkpoint_and_the_final_model(tiny_lm_dir, tmp_path):
    """A model folder with licence.json: each checkpoint, the final adapter and merged/ carry
    the same files, the declaration with training appended, and MODIFIED.md saying so."""
    source = tmp_path / "model"
    shutil.copytree(tiny_lm_dir("llama"), source)
    declared = ModelLicence("gemma", "ai.google.dev/gemma/terms",
                            {"NOTICE": b"the notice\n", "TERMS.html": b"<p>terms</p>"})  # fmt: skip
    write_licence(declared, source, "Dequantized.")
    first = read_licence(source)
    config = {
        "prompts_per_step": 2, "grpo": {"group_size": 2, "batch_size": 4, "kl_coeff": 0.0},
        "model": {"use_reference": False, "lora": {"r": 4, "alpha": 8}, "save_merged": True},
        "policy": {"generation": {"max_new_tokens": 3}}, "schedule": {"num_steps": 2},
        "evaluation": {"every": 0},
        "run": {"dir": str(tmp_path / "run"), "tensorboard": False, "checkpoint_every": 1},
    }  # fmt: skip
    prompts = [{"prompt": f"say {w}"} for w in "abcd"]
    TextTrainer(source, lambda prompts, completions, **_: [float(len(c)) for c in completions],
                prompts, config=config).train()  # fmt: skip
    run = tmp_path / "run"
    saved = [run / "checkpoints" / "step-000001", run / "checkpoints" / "step-000002",
             run / "final", run / "final" / "merged"]  # fmt: skip
    for folder in saved:
        carried = read_licence(folder)
        assert carried.files == first.files and carried.licence == "gemma", folder
        assert carried.modifications[:-1] == first.modifications, folder
        assert carried.modifications[-1].startswith(TRAINED), folder
        assert TRAINED in (folder / "MODIFIED.md").read_text()
    assert "step 1" in read_licence(saved[0]).modifications[-1]


def test_a_model_folder_that_lost_a_declared_licence_file_is_refused_first(tiny_lm_dir, tmp_path):
    """model.path whose licence.json names a file no longer there: a config error naming it,
    before any model loads or run directory exists."""
    source = tmp_path / "model"
    shutil.copytree(tiny_lm_dir("llama"), source)
    write_licence(ModelLicence("gemma", "ai.google.dev/gemma/terms", {"NOTICE": b"n\n"}), source, "Dequantized.")
    (source / "NOTICE").unlink()
    config = {"model": {"path": str(source)}, "task": {"name": "arithmetic"},
              "run": {"dir": str(tmp_path / "run")}}  # fmt: skip
    with pytest.raises(ConfigError, match="model.path: .*licence.json declares 'NOTICE', which is missing"):
        load_config(config)
    assert not (tmp_path / "run").exists()
