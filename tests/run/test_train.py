"""Tests for grpo.run.train: a run closes its policy (e.g. a vLLM engine) however it ends."""

from __future__ import annotations

import pytest
from toy_models import FunctionReward, TablePolicy, best_arm_reward

from grpo.rewards.errors import RewardError
from grpo.run.config_files import load_config
from grpo.run.parts import TaskParts
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
