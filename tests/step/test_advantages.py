"""AdvantageEstimator: the framework API's group-relative advantages, flattened state-major."""

import math

import pytest
import torch

from grpo.records import ExperienceBatch
from grpo.step.advantages import AdvantageEstimator


def _batch(reward_groups):
    B, G = len(reward_groups), len(reward_groups[0])
    return ExperienceBatch(
        states=list(range(B)),
        action_groups=[[0] * G for _ in range(B)],
        reward_groups=reward_groups,
        log_prob_old_groups=[[0.0] * G for _ in range(B)],
    )


def _by_hand(group, eps, normalise):
    mean = sum(group) / len(group)
    std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
    return [(r - mean) / (std + eps) if normalise else r - mean for r in group]


REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0]]


def test_normalised_is_group_mean_over_group_std():
    """Default: A_ij = (r_ij - mean_i) / (std_i + eps), unbiased std, in flat order."""
    adv = AdvantageEstimator(normalize_advantages=True).compute_advantages(_batch(REWARDS))
    expected = [a for g in REWARDS[:2] for a in _by_hand(g, 1e-4, True)] + [0.0] * 4
    assert adv.shape == (12,) and adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-5, atol=1e-7)


def test_unnormalised_is_reward_minus_group_mean():
    """normalize_advantages=False: A_ij = r_ij - mean_i exactly (the framework API's formula)."""
    adv = AdvantageEstimator(normalize_advantages=False).compute_advantages(_batch(REWARDS))
    expected = [a for g in REWARDS for a in _by_hand(g, 0.0, False)]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=0)


def test_no_leakage_across_states():
    """Changing one state's rewards leaves every other state's advantages unchanged."""
    estimator = AdvantageEstimator()
    before = estimator.compute_advantages(_batch(REWARDS))
    changed = [REWARDS[0], [5.0, -1.0, 7.0, 0.5], REWARDS[2]]
    after = estimator.compute_advantages(_batch(changed))
    assert torch.equal(before[:4], after[:4]) and torch.equal(before[8:], after[8:])


def test_batch_scale_divides_by_one_batch_std():
    """scale='batch' (the framework API's text): group-centred, divided by the std of all rewards."""
    flat = [r for g in REWARDS for r in g]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((r - mean) ** 2 for r in flat) / (len(flat) - 1))
    centred = [a for g in REWARDS for a in _by_hand(g, 0.0, False)]
    adv = AdvantageEstimator(scale="batch", advantage_epsilon=1e-4).compute_advantages(
        _batch(REWARDS)
    )
    torch.testing.assert_close(
        adv, torch.tensor([c / (std + 1e-4) for c in centred]), rtol=1e-5, atol=1e-7
    )
    assert abs(adv.sum().item()) < 1e-5  # centred across the batch too


def test_positive_only_and_leave_one_out():
    """positive_only clamps at 0; leave_one_out compares each reward with the other G-1."""
    group = [[1.0, 0.0, 0.0, 3.0]]
    adv = AdvantageEstimator(
        normalize_advantages=False, baseline="leave_one_out", positive_only=True
    ).compute_advantages(_batch(group))
    expected = [max(0.0, r - (sum(group[0]) - r) / 3) for r in group[0]]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=0)


def test_contradicting_options_and_ragged_groups_rejected():
    """scale with normalize_advantages=False, and groups of unequal size, are errors."""
    with pytest.raises(ValueError, match="contradicts normalize_advantages=False"):
        AdvantageEstimator(normalize_advantages=False, scale="group")
    ragged = _batch([[1.0, 0.0], [1.0, 0.0]])._replace(reward_groups=[[1.0, 0.0], [1.0]])
    with pytest.raises(ValueError, match=r"same size; got sizes \[1, 2\]"):
        AdvantageEstimator().compute_advantages(ragged)
