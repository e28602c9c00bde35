"""Tests for grpo.functional.importance and the importance_weights argument of policy_loss."""

import math

import pytest
import torch

from grpo.functional import policy_loss
from grpo.functional.importance import logprob_gap, truncated_importance_weights

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.25, 7.0]], dtype=torch.float64)
SAMPLER = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -0.75, -9.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, True], [True, True, False]])  # last slot: padding


def test_truncated_weights_hand_values():
    """w = min(exp(old - sampler), cap) on counted tokens and exactly 1 at padding."""
    weights = truncated_importance_weights(OLD, SAMPLER, MASK, cap=1.5)
    expected = [[min(math.exp(0.5), 1.5), math.exp(-1.0), 1.0], [math.exp(-1.0), 1.5, 1.0]]
    torch.testing.assert_close(
        weights, torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0
    )


def test_truncated_weights_carry_no_gradient():
    """The weights are constants: no graph reaches old or sampler log-probs."""
    old = OLD.clone().requires_grad_(True)
    weights = truncated_importance_weights(old, SAMPLER, MASK, cap=2.0)
    assert not weights.requires_grad


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sampler_logprobs": SAMPLER[:, :2]}, "sampler_logprobs"),
        ({"completion_mask": MASK.float()}, "completion_mask"),
        ({"cap": 0.0}, "cap"),
        ({"cap": float("nan")}, "cap"),
    ],
)
def test_truncated_weights_reject_bad_input(kwargs, match):
    """Mismatched shapes, a non-bool mask and a cap that is not a finite positive number are named."""
    args = {"old_logprobs": OLD, "sampler_logprobs": SAMPLER, "completion_mask": MASK, "cap": 2.0}
    with pytest.raises((ValueError, TypeError), match=match):
        truncated_importance_weights(**{**args, **kwargs})


def test_logprob_gap_hand_values():
    """Mean and max of |old - sampler| over the five counted tokens; padding (|7 + 9|) ignored."""
    gap = logprob_gap(OLD, SAMPLER, MASK)
    assert gap["mean"] == pytest.approx((0.5 + 1.0 + 0.0 + 1.0 + 0.5) / 5, rel=1e-12)
    assert gap["max"] == pytest.approx(1.0, rel=1e-12)


def test_logprob_gap_of_nothing_counted_is_zero():
    """With no counted token the gap is 0, not NaN."""
    assert logprob_gap(OLD, SAMPLER, torch.zeros_like(MASK)) == {"mean": 0.0, "max": 0.0}


def _reinforce(weights=None):
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, stats = policy_loss(
        logprobs,
        None,
        advantages,
        mask,
        loss_type="reinforce",
        aggregation="token_mean",
        importance_weights=weights,
    )
    loss.backward()
    return loss, stats, logprobs.grad


def test_unit_importance_weights_leave_the_loss_unchanged():
    """Weights of 1 give exactly the unweighted loss and gradient."""
    plain, _, plain_grad = _reinforce()
    ones, stats, ones_grad = _reinforce(torch.ones(2, 2, dtype=torch.float64))
    torch.testing.assert_close(ones, plain, rtol=0, atol=0)
    torch.testing.assert_close(ones_grad, plain_grad, rtol=0, atol=0)
    torch.testing.assert_close(
        stats["importance_weight/mean"], torch.tensor(1.0, dtype=torch.float64)
    )


def test_importance_weights_scale_each_token_loss():
    """token_mean of -w·A·logp: hand value, and each token's gradient is -w·A / 3 counted tokens."""
    weights = torch.tensor([[2.0, 0.5], [1.5, 99.0]], dtype=torch.float64)  # 99 sits in padding
    loss, stats, grad = _reinforce(weights)
    # tokens: -(2)(1)(-1) = 2, -(0.5)(1)(-2) = 1, -(1.5)(-2)(-0.5) = -1.5
    assert loss.item() == pytest.approx((2.0 + 1.0 - 1.5) / 3, rel=1e-12)
    expected_grad = torch.tensor([[-2.0 / 3, -0.5 / 3], [3.0 / 3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=0)
    assert stats["importance_weight/mean"].item() == pytest.approx((2.0 + 0.5 + 1.5) / 3)


def test_importance_weights_must_match_the_shape():
    """A (N, T) mismatch is named."""
    with pytest.raises(ValueError, match="importance_weights"):
        _reinforce(torch.ones(2, 3, dtype=torch.float64))


def test_an_untruncated_weight_stays_finite_in_float32():
    """exp(100) overflows float32: with no cap the weight is float32's largest number, never
    inf; weights within range are exact, and a cap still applies."""
    old = torch.tensor([[0.0, -1.0]])  # float32
    sampler = torch.tensor([[-100.0, -1.5]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = truncated_importance_weights(old, sampler, mask, cap=None)
    assert weights.dtype == torch.float32 and bool(torch.isfinite(weights).all())
    assert weights[0, 0].item() == torch.finfo(torch.float32).max
    assert weights[0, 1].item() == pytest.approx(math.exp(0.5), rel=1e-6)
    capped = truncated_importance_weights(old, sampler, mask, cap=2.0)
    assert capped[0].tolist() == pytest.approx([2.0, math.exp(0.5)], rel=1e-6)


def test_the_stale_correction_without_a_cap_stays_finite():
    """behaviour_weights with tis_cap None (untruncated) on a log-ratio of 120: finite."""
    from grpo.step.objective import behaviour_weights

    weights = behaviour_weights(
        torch.tensor([[0.0]]), torch.tensor([[-120.0]]), torch.ones(1, 1, dtype=torch.bool), None
    )
    assert bool(torch.isfinite(weights).all()) and weights.item() == torch.finfo(torch.float32).max
