"""Protocol checks: duck-typed models pass, incomplete ones fail in the framework API's format."""

import subprocess
import sys
from pathlib import Path

import pytest
from toy_models import FunctionReward, SequencePolicy, TablePolicy, best_arm_reward

import grpo
from grpo.protocols import validate_policy_model, validate_reward_model


class IncompletePolicy:  # the framework API, "Runtime Validation"
    def generate_actions(self, states, num_actions_per_state, **kwargs):
        return [[f"action_{i}"] for _ in states for i in range(num_actions_per_state)]


SEED_004_MESSAGE = (
    "Model IncompletePolicy does not implement PolicyModel protocol.\n"
    "Missing methods: get_log_probabilities, get_parameters, train, eval, to\n"
    "Required methods: generate_actions, get_log_probabilities, get_parameters, train, eval, to"
)


def test_trainer_rejects_incomplete_policy_with_seed_message():
    """GRPOTrainer raises TypeError whose text is the framework API's three lines exactly."""
    with pytest.raises(TypeError) as err:
        grpo.GRPOTrainer(policy_model=IncompletePolicy(), reward_model=best_arm_reward(4, 3))
    assert str(err.value) == SEED_004_MESSAGE


def test_trainer_rejects_incomplete_reward_model():
    """A reward model without to/eval/train is named with its missing methods."""

    class ScoreOnly:
        def compute_rewards(self, states, actions):
            return None

    with pytest.raises(TypeError, match=r"Model ScoreOnly does not implement RewardModel") as err:
        grpo.GRPOTrainer(TablePolicy(4, 3), ScoreOnly())
    assert "Missing methods: to, eval, train" in str(err.value)


def test_complete_models_pass_and_are_runtime_instances():
    """Duck-typed toy models satisfy both validators and isinstance on the Protocols."""
    for policy in (TablePolicy(4, 3), SequencePolicy(4, 5, 3)):
        validate_policy_model(policy)
        assert isinstance(policy, grpo.PolicyModel)
    validate_reward_model(FunctionReward(lambda s, a: 0.0))
    assert isinstance(FunctionReward(lambda s, a: 0.0), grpo.RewardModel)
    assert isinstance(SequencePolicy(4, 5, 3), grpo.TokenLevelPolicy)
    assert not isinstance(TablePolicy(4, 3), grpo.TokenLevelPolicy)


def test_non_callable_attribute_counts_as_missing():
    """An attribute named like a method but not callable is reported as missing."""
    policy = TablePolicy(4, 3)
    policy.to = "cpu"
    with pytest.raises(TypeError, match=r"Missing methods: to\n"):
        validate_policy_model(policy)


def test_public_names_resolve_and_import_stays_light():
    """Every public name resolves, and neither `import grpo` nor the trainer pulls transformers."""
    code = (
        "import sys, grpo\n"
        "assert 'torch' not in sys.modules, 'import grpo imported torch'\n"
        "for name in grpo.__all__: getattr(grpo, name)\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stderr
    expected = {
        "GRPOTrainer",
        "GRPOConfig",
        "PolicyModel",
        "RewardModel",
        "TokenLevelPolicy",
        "TokenLogProbs",
        "ExperienceBatch",
        "validate_policy_model",
        "validate_reward_model",
    }
    assert expected <= set(grpo.__all__)
