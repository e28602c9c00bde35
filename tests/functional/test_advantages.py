"""Tests for grpo.functional.advantages: the group formula, variants, bad input."""

import pytest
import torch

from grpo.functional import BASELINES, SCALES, group_advantages
from grpo.functional.advantages import informative, informative_groups

# rewards [0, 1, 2, 3]: mean 1.5, unbiased std sqrt(5/3) = 1.2909944487358056
GROUP_STD_PLUS_EPS = 1.2910944487358056


def _close(actual, expected):
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-6, atol=1e-7
    )


def test_default_formula_hand_values():
    """Defaults give (r - mean) / (std_unbiased + 1e-4) per group of G."""
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    # group 2: mean 0.5, std sqrt(1/3) = 0.5773502691896257, 0.5 / 0.5774502691896257
    g2 = 0.8658754297607016
    expected = [
        -1.161805010833055,
        -0.3872683369443517,
        0.3872683369443517,
        1.161805010833055,
        g2,
        -g2,
        -g2,
        g2,
    ]
    _close(group_advantages(rewards, 4), expected)


def test_default_equals_the_reshape_mean_std_code():
    """group_advantages equals view/mean/std/repeat_interleave code written out, on random rewards."""
    rewards = torch.rand(6 * 4, generator=torch.Generator().manual_seed(0))
    grouped = rewards.view(6, 4)
    mean = grouped.mean(dim=1).repeat_interleave(4)
    std = (grouped.std(dim=1) + 1e-4).repeat_interleave(4)
    torch.testing.assert_close(
        group_advantages(rewards, 4), (rewards - mean) / std, rtol=1e-6, atol=0
    )


def test_leave_one_out_hand_values():
    """RLOO baseline is the mean of the other G-1: [0,1,2,3] -> [-2, -2/3, 2/3, 2] before scaling."""
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    _close(
        group_advantages(rewards, 4, baseline="leave_one_out", scale="none"),
        [-2.0, -2.0 / 3.0, 2.0 / 3.0, 2.0],
    )
    d = GROUP_STD_PLUS_EPS
    _close(
        group_advantages(rewards, 4, baseline="leave_one_out"),
        [-2.0 / d, -2.0 / 3.0 / d, 2.0 / 3.0 / d, 2.0 / d],
    )


def test_batch_scale_and_no_baseline_hand_values():
    """scale='batch' divides by the std of all N rewards + eps; baseline='none' keeps rewards."""
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    # all 8: mean 1.25, squared deviations sum 5.5, std sqrt(5.5 / 7) = 0.8864052604279183
    a = [-1.6920373368974102, -0.5640124456324701, 0.5640124456324701, 1.6920373368974102]
    _close(group_advantages(rewards, 4, scale="batch"), a + [0.0] * 4)
    _close(group_advantages(rewards, 4, baseline="none", scale="none"), rewards.tolist())


def test_group_scale_forgets_a_reward_weight_that_batch_scale_keeps():
    """Group 0 told apart by a reward of weight 1, group 1 by one of weight 0.1 (the same
    pattern): each group's own std gives both the same advantages (eps = 0), one batch std keeps
    group 1's at a tenth of group 0's."""
    pattern = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    rewards = torch.cat([pattern, 0.1 * pattern + 0.5])
    group = group_advantages(rewards, 4, scale="group", eps=0.0).view(2, 4)
    torch.testing.assert_close(group[1], group[0])
    batch = group_advantages(rewards, 4, scale="batch", eps=0.0).view(2, 4)
    torch.testing.assert_close(batch[1], 0.1 * batch[0])


def test_positive_only_clamps_negatives():
    """positive_only sets negative advantages to 0 and leaves positive ones (picoRL)."""
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    _close(
        group_advantages(rewards, 4, positive_only=True),
        [0.0, 0.0, 0.3872683369443517, 1.161805010833055],
    )


@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("eps", [1e-4, 0.0])
def test_zero_variance_groups_give_exact_zeros(baseline, scale, eps):
    """A group whose rewards are all equal gets exactly 0, never NaN, for every scale and eps."""
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=torch.float32)
    out = group_advantages(rewards, 3, baseline=baseline, scale=scale, eps=eps)
    assert torch.equal(out, torch.zeros(6))


def test_integer_rewards_accepted_as_float():
    """0/1 integer rewards give the same advantages as their float copy."""
    ints = torch.tensor([1, 0, 0, 1])
    torch.testing.assert_close(group_advantages(ints, 2), group_advantages(ints.float(), 2))


def test_tables_name_every_variant():
    """BASELINES and SCALES hold exactly the documented names."""
    assert set(BASELINES) == {"mean", "leave_one_out", "none"}
    assert set(SCALES) == {"group", "batch", "none"}


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"rewards": torch.zeros(6), "group_size": 4}, "rewards"),
        ({"rewards": torch.zeros(6), "group_size": 1}, "group_size"),
        ({"rewards": torch.zeros(6), "group_size": 2.0}, "group_size"),
        ({"rewards": torch.zeros(2, 3), "group_size": 3}, "rewards"),
        ({"rewards": torch.zeros(0), "group_size": 2}, "rewards"),
        ({"rewards": torch.tensor([0.0, float("nan")]), "group_size": 2}, "rewards"),
        ({"rewards": torch.tensor([0.0, float("inf")]), "group_size": 2}, "rewards"),
        ({"rewards": torch.zeros(4), "group_size": 2, "baseline": "median"}, "baseline"),
        ({"rewards": torch.zeros(4), "group_size": 2, "scale": "max"}, "scale"),
        ({"rewards": torch.zeros(4), "group_size": 2, "eps": -1.0}, "eps"),
    ],
)
def test_bad_input_raises_value_error_naming_argument(kwargs, argument):
    """Bad input raises ValueError whose message starts with the argument's name."""
    with pytest.raises(ValueError, match=f"^{argument}:"):
        group_advantages(**kwargs)


def test_unknown_name_lists_allowed_values():
    """An unknown baseline's message shows the value given and the allowed names."""
    with pytest.raises(ValueError, match="'median'.*'mean', 'leave_one_out', 'none'"):
        group_advantages(torch.zeros(4), 2, baseline="median")


def test_informative_means_some_advantage_is_not_zero():
    """informative: advantage != 0 per sample; a group is informative when any sample is, under
    every baseline and positive_only alike (equal rewards without a baseline are informative)."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 0.0, 0.0])  # G = 2: 4 groups
    mean = group_advantages(rewards, 2)
    assert informative(mean).tolist() == [False, False, True, True, False, False, False, False]
    assert informative_groups(mean, 2).tolist() == [False, True, False, False]
    plain = group_advantages(rewards, 2, baseline="none", scale="none")
    assert informative_groups(plain, 2).tolist() == [True, True, True, False]
    positive = group_advantages(rewards, 2, positive_only=True)
    assert informative(positive).tolist() == [False, False, False, True] + [False] * 4
