"""ExperienceCollector: grouped, aligned, no-grad rollouts and clear errors on bad input."""

import pickle

import pytest
import torch
from toy_models import FunctionReward, SequencePolicy, TablePolicy, best_arm_reward

from grpo.step.collect import ExperienceCollector


def test_groups_are_state_major_and_aligned():
    """Rewards and old log-probs line up with the (state, action) they were computed for."""
    torch.manual_seed(0)
    policy = TablePolicy(5, 4)
    reward = FunctionReward(lambda s, a: 10.0 * s + a)
    batch = ExperienceCollector(policy, reward, group_size=3).collect_experiences([0, 3, 4])
    assert batch.states == [0, 3, 4]
    assert [len(g) for g in batch.action_groups] == [3, 3, 3]
    for i, s in enumerate(batch.states):
        for j, a in enumerate(batch.action_groups[i]):
            assert batch.reward_groups[i][j] == 10.0 * s + a
    expected = policy.get_log_probabilities(batch.flat_states(), batch.flat_actions())
    got = torch.tensor([lp for g in batch.log_prob_old_groups for lp in g])
    torch.testing.assert_close(got, expected.detach(), rtol=1e-6, atol=0)
    assert isinstance(batch.log_prob_old_groups[0][0], float)
    assert batch.old_token_logprobs is None and batch.completion_mask is None


def test_sampling_runs_in_eval_mode_without_grad_and_mode_is_restored():
    """generate_actions sees eval mode and no grad; the caller's train/eval mode comes back."""
    seen = []

    class Recording(TablePolicy):
        def generate_actions(self, states, num_actions_per_state, **kwargs):
            seen.append((self.training, torch.is_grad_enabled()))
            return super().generate_actions(states, num_actions_per_state)

    policy = Recording(3, 2)
    collector = ExperienceCollector(policy, best_arm_reward(3, 2), group_size=2)
    collector.collect_experiences([0, 1])
    assert seen == [(False, False)] and policy.training is True
    policy.eval()
    collector.collect_experiences([0, 1])
    assert policy.training is False


def test_token_level_policy_records_token_logprobs_and_mask():
    """A TokenLevelPolicy gets (N, T) log-probs and mask; per-sample values are masked sums."""
    torch.manual_seed(1)
    policy = SequencePolicy(3, 4, max_length=4)
    batch = ExperienceCollector(policy, FunctionReward(lambda s, a: len(a)), 4).collect_experiences(
        [0, 1, 2]
    )
    actions = batch.flat_actions()
    T = max(len(a) for a in actions)
    assert batch.old_token_logprobs.shape == (12, T)
    assert batch.completion_mask.tolist() == [[t < len(a) for t in range(T)] for a in actions]
    sums = (batch.old_token_logprobs * batch.completion_mask).sum(-1)
    flat_old = torch.tensor([lp for g in batch.log_prob_old_groups for lp in g])
    torch.testing.assert_close(flat_old, sums, rtol=1e-6, atol=1e-7)
    assert not batch.old_token_logprobs.requires_grad


def test_batch_survives_pickle():
    """An ExperienceBatch of plain lists round-trips through pickle unchanged."""
    batch = ExperienceCollector(TablePolicy(3, 2), best_arm_reward(3, 2), 2).collect_experiences(
        [1]
    )
    assert pickle.loads(pickle.dumps(batch)) == batch


def test_empty_states_rejected():
    """No states is an error before any model is called."""
    with pytest.raises(ValueError, match="states must be a non-empty list"):
        ExperienceCollector(TablePolicy(3, 2), best_arm_reward(3, 2), 2).collect_experiences([])


class ShortGroupPolicy(TablePolicy):
    """Returns one action too few for state 1."""

    def generate_actions(self, states, num_actions_per_state, **kwargs):
        groups = super().generate_actions(states, num_actions_per_state)
        groups[1] = groups[1][:-1]
        return groups


def test_wrong_group_size_names_the_state():
    """A group of the wrong length is reported as 'state i: expected G actions, got g'."""
    collector = ExperienceCollector(ShortGroupPolicy(4, 3), best_arm_reward(4, 3), group_size=8)
    with pytest.raises(ValueError, match="state 1: expected 8 actions, got 7"):
        collector.collect_experiences([0, 1, 2])


def test_wrong_number_of_groups_rejected():
    """One group per state is required."""

    class Missing(TablePolicy):
        def generate_actions(self, states, num_actions_per_state, **kwargs):
            return super().generate_actions(states, num_actions_per_state)[:-1]

    collector = ExperienceCollector(Missing(4, 3), best_arm_reward(4, 3), group_size=2)
    with pytest.raises(ValueError, match="expected 3 groups .one per state., got 2"):
        collector.collect_experiences([0, 1, 2])


def test_reward_of_wrong_shape_rejected():
    """A (B, G) reward tensor instead of (N,) is refused, with both shapes in the message."""

    class GridReward(FunctionReward):
        def compute_rewards(self, states, actions):
            return torch.zeros(len(states) // 2, 2)

    collector = ExperienceCollector(TablePolicy(4, 3), GridReward(None), group_size=2)
    with pytest.raises(ValueError, match=r"shape \(6,\) for 3 states x 2 actions; got \(3, 2\)"):
        collector.collect_experiences([0, 1, 2])


def test_nan_reward_names_the_sample():
    """A NaN reward is refused with its flat index and (state, action) position."""
    reward = FunctionReward(lambda s, a: float("nan") if s == 2 else 1.0)
    collector = ExperienceCollector(TablePolicy(4, 3), reward, group_size=2)
    with pytest.raises(
        ValueError, match=r"non-finite value nan for sample 4 \(state 2, action 0\)"
    ):
        collector.collect_experiences([0, 1, 2])


def test_logprobs_of_wrong_shape_rejected():
    """get_log_probabilities must return one value per pair, shape (N,)."""

    class Column(TablePolicy):
        def get_log_probabilities(self, states, actions):
            return super().get_log_probabilities(states, actions)[:, None]

    collector = ExperienceCollector(Column(4, 3), best_arm_reward(4, 3), group_size=2)
    with pytest.raises(ValueError, match=r"shape \(4,\) for 4 state-action pairs; got \(4, 1\)"):
        collector.collect_experiences([0, 1])


def test_single_string_or_tensor_groups_rejected():
    """A bare string is not a list of states; a tensor of actions is not a list of groups."""
    collector = ExperienceCollector(TablePolicy(4, 3), best_arm_reward(4, 3), group_size=2)
    with pytest.raises(TypeError, match="got a single str"):
        collector.collect_experiences("prompt")

    class TensorActions(TablePolicy):
        def generate_actions(self, states, num_actions_per_state, **kwargs):
            return torch.tensor(super().generate_actions(states, num_actions_per_state))

    collector = ExperienceCollector(TensorActions(4, 3), best_arm_reward(4, 3), group_size=2)
    with pytest.raises(TypeError, match=r"got a Tensor \(convert tensors with .tolist\(\)\)"):
        collector.collect_experiences([0, 1])


def test_dynamic_sampling_keeps_informative_groups_and_reports_every_sampled_reward():
    """Hand-built rounds: groups 1 and 3 are informative and kept; reward/sampled_mean is over
    all four groups sampled (14 / 8), while the kept ones average 1.5."""
    from grpo.distributed import SingleProcess
    from grpo.functional.advantages import group_advantages
    from grpo.records import Rollout
    from grpo.step.collect import fill_informative

    pays = {0: [1.0, 1.0], 1: [0.0, 2.0], 2: [3.0, 3.0], 3: [0.0, 4.0]}

    def sample(states):
        return Rollout([s for s in states for _ in range(2)], ["a", "b"] * len(states),
                       torch.tensor([r for s in states for r in pays[s]]))  # fmt: skip

    kept, metrics = fill_informative(
        sample, [0, 1], lambda: [2, 3], SingleProcess(), lambda r: group_advantages(r, 2), 2, 3
    )
    assert kept.states == [1, 1, 3, 3] and kept.rewards.mean().item() == 1.5
    assert metrics == {"dynamic/rounds": 2.0, "dynamic/informative_frac": 1.0,
                       "dynamic/sampled_zero_std_frac": 0.5, "dynamic/capped": 0.0,
                       "reward/sampled_mean": 1.75}  # fmt: skip
