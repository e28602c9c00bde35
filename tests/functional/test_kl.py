"""Tests for grpo.functional.kl: hand values and exact-enumeration gradient targets."""

import math

import pytest
import torch

from grpo.functional import KL_ESTIMATORS, kl_estimate

LN2 = math.log(2.0)


def test_hand_values():
    """π = 1/2, π_ref = 1/4: k1 = ln 2, k2 = (ln 2)²/2, k3 = 1/2 - 1 + ln 2."""
    logprobs = torch.tensor([math.log(0.5)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25)], dtype=torch.float64)
    expected = {"k1": 0.6931471805599453, "k2": 0.2402265069591007, "k3": 0.1931471805599453}
    for name, value in expected.items():
        torch.testing.assert_close(
            kl_estimate(logprobs, ref, name),
            torch.tensor([value], dtype=torch.float64),
            rtol=1e-12,
            atol=0,
        )


def test_equal_policies_give_zero():
    """Every estimator is exactly 0 where π = π_ref."""
    logprobs = torch.tensor([-0.3, -2.0, -7.5])
    for name in KL_ESTIMATORS:
        assert torch.equal(kl_estimate(logprobs, logprobs.clone(), name), torch.zeros(3))


def _categorical(seed):
    """Logits θ of a 5-outcome policy (with grad) and a fixed reference, in float64."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(5, generator=gen, dtype=torch.float64).requires_grad_()
    ref_logprobs = torch.randn(5, generator=gen, dtype=torch.float64).log_softmax(-1)
    return theta, ref_logprobs


def _expected_loss_gradient(theta, ref_logprobs, estimator):
    """Σ_a π(a) ∇θ k(a): the expected gradient of k(a) on a ~ π, with a held fixed."""
    logprobs = theta.log_softmax(-1)  # (5,) every outcome a
    per_outcome = kl_estimate(logprobs, ref_logprobs, estimator)  # (5,)
    # the sampling distribution weights the outcomes but is not differentiated
    surrogate = (logprobs.exp().detach() * per_outcome).sum()
    return torch.autograd.grad(surrogate, theta)[0]


def _kl_gradient(theta, ref_logprobs, reverse):
    """∇θ KL(π‖π_ref) (reverse=False) or ∇θ KL(π_ref‖π) (reverse=True), by autograd."""
    logprobs = theta.log_softmax(-1)
    if reverse:
        kl = (ref_logprobs.exp() * (ref_logprobs - logprobs)).sum()
    else:
        kl = (logprobs.exp() * (logprobs - ref_logprobs)).sum()
    return torch.autograd.grad(kl, theta)[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k1_in_loss_has_zero_expected_gradient(seed):
    """E_π[∇ k1] = E_π[∇ log π] = 0: k1 in the loss does not regularise."""
    theta, ref = _categorical(seed)
    grad = _expected_loss_gradient(theta, ref, "k1")
    torch.testing.assert_close(grad, torch.zeros(5, dtype=torch.float64), rtol=0, atol=1e-12)
    assert _kl_gradient(theta, ref, reverse=False).abs().max() > 1e-2  # the target is not 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k2_in_loss_gives_reverse_kl_gradient(seed):
    """E_π[∇ k2] = ∇ KL(π‖π_ref) exactly."""
    theta, ref = _categorical(seed)
    torch.testing.assert_close(
        _expected_loss_gradient(theta, ref, "k2"),
        _kl_gradient(theta, ref, reverse=False),
        rtol=0,
        atol=1e-10,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_in_loss_gives_forward_kl_gradient(seed):
    """E_π[∇ k3] = ∇ KL(π_ref‖π) exactly, and differs from ∇ KL(π‖π_ref)."""
    theta, ref = _categorical(seed)
    grad = _expected_loss_gradient(theta, ref, "k3")
    torch.testing.assert_close(grad, _kl_gradient(theta, ref, reverse=True), rtol=0, atol=1e-10)
    assert (grad - _kl_gradient(theta, ref, reverse=False)).abs().max() > 1e-3


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_k1_and_k3_values_are_unbiased(estimator):
    """E_π[k1] = E_π[k3] = KL(π‖π_ref) as values (Schulman 2020)."""
    theta, ref = _categorical(3)
    logprobs = theta.detach().log_softmax(-1)
    expected_value = (logprobs.exp() * kl_estimate(logprobs, ref, estimator)).sum()
    kl = (logprobs.exp() * (logprobs - ref)).sum()
    torch.testing.assert_close(expected_value, kl, rtol=1e-12, atol=0)


def test_shape_mismatch_names_argument():
    """Mismatched shapes raise ValueError naming ref_logprobs and both shapes."""
    with pytest.raises(ValueError, match=r"^ref_logprobs: shape \(2, 3\).*\(2, 4\)"):
        kl_estimate(torch.zeros(2, 4), torch.zeros(2, 3))


def test_unknown_estimator_lists_allowed():
    """An unknown estimator raises ValueError naming it and the allowed names."""
    with pytest.raises(ValueError, match="^estimator: got 'k4'; allowed: 'k1', 'k2', 'k3'"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")
