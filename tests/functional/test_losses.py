"""Tests for grpo.functional.losses: hand values, gradients, padding, bad input."""

import math
import warnings

import pytest
import torch

from grpo.functional import AGGREGATIONS, POLICY_LOSSES, aggregate, policy_loss


def _close(actual, expected, rtol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=1e-9)


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# two sequences, T = 3; the second has 2 counted tokens and garbage in its pad slot
LOGPROBS = [[-1.0, -2.0, -3.0], [-0.5, -1.5, 123.0]]
MASK = torch.tensor([[True, True, True], [True, True, False]])
ADVANTAGES = torch.tensor([1.0, -0.5], dtype=torch.float64)


@pytest.mark.parametrize(
    ("aggregation", "max_length", "expected"),
    [
        # per-token -A·logp: [1, 2, 3] and [-0.25, -0.75]
        ("sequence_mean", None, (6 / 3 + -1 / 2) / 2),  # 0.75
        ("token_mean", None, 5 / 5),  # (6 - 1) / 5 counted tokens
        ("constant_length", 4, 5 / (2 * 4)),  # / (N * L_max)
        ("constant_length", None, 5 / (2 * 3)),  # L_max defaults to T
        ("sequence_sum", None, (6 - 1) / 2),
    ],
)
def test_reinforce_aggregations_hand_values(aggregation, max_length, expected):
    """Each aggregation divides the masked token sum by its documented denominator."""
    logprobs = _leaf(LOGPROBS)
    loss, stats = policy_loss(
        logprobs,
        None,
        ADVANTAGES,
        MASK,
        loss_type="reinforce",
        aggregation=aggregation,
        max_completion_length=max_length,
    )
    _close(loss, expected)
    _close(stats["loss/policy"], expected)
    _close(stats["ratio/mean"], 1.0)


def _clip_case():
    """Four one-token sequences with ratios [1.5, 0.5, 1.1, 0.5] and A = [1, -1, 2, 1]."""
    logprobs = _leaf([[0.0], [0.0], [0.0], [0.0]])
    old = -torch.log(torch.tensor([[1.5], [0.5], [1.1], [0.5]], dtype=torch.float64))
    advantages = torch.tensor([1.0, -1.0, 2.0, 1.0], dtype=torch.float64)
    return logprobs, old, advantages, torch.ones(4, 1, dtype=torch.bool)


def test_clipped_hand_values_and_zero_gradient_when_clipped():
    """-min(rA, clip(r)A) = [-1.2, 0.8, -2.2, -0.5]; clipped tokens get exactly 0 gradient."""
    logprobs, old, advantages, mask = _clip_case()
    loss, stats = policy_loss(logprobs, old, advantages, mask, aggregation="token_mean")
    _close(loss, (-1.2 + 0.8 - 2.2 - 0.5) / 4)
    _close(stats["clip/high_frac"], 0.25)
    _close(stats["clip/low_frac"], 0.25)
    _close(stats["ratio/mean"], (1.5 + 0.5 + 1.1 + 0.5) / 4)
    (grad,) = torch.autograd.grad(loss, logprobs)
    # d(-rA)/dlogp = -rA for unclipped tokens, / 4 tokens
    _close(grad, [[0.0], [0.0], [-2.2 / 4], [-0.5 / 4]])
    assert grad[0, 0].item() == 0.0 and grad[1, 0].item() == 0.0


@pytest.mark.parametrize("loss_type", ["clipped", "gspo"])
def test_a_negative_advantage_past_the_upper_bound_is_not_clipped(loss_type):
    """A < 0 with r = 1.5 > 1 + eps: the pessimistic bound picks r·A itself, so the loss is
    1.5 and the gradient d(-rA)/dlogp = -rA = +1.5, not 0; clip/high_frac counts only the
    A > 0 token past the bound, clip/low_frac only A < 0 below it (one token sequences: the
    GSPO sequence ratio is the token's ratio)."""
    logprobs = _leaf([[0.0], [0.0], [0.0]])
    old = -torch.log(torch.tensor([[1.5], [1.5], [0.5]], dtype=torch.float64))
    advantages = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(3, 1, dtype=torch.bool)
    loss, stats = policy_loss(
        logprobs, old, advantages, mask, loss_type=loss_type, aggregation="token_mean"
    )
    _close(loss, (1.5 - 1.2 + 0.8) / 3)
    _close(stats["clip/high_frac"], 1 / 3)
    _close(stats["clip/low_frac"], 1 / 3)
    (grad,) = torch.autograd.grad(loss, logprobs)
    _close(grad, [[1.5 / 3], [0.0], [0.0]])


def test_clipped_decoupled_eps_high():
    """eps_high = 0.28 (DAPO clip-higher) caps the first token at 1.28 instead of 1.2."""
    logprobs, old, advantages, mask = _clip_case()
    loss, _ = policy_loss(logprobs, old, advantages, mask, aggregation="token_mean", eps_high=0.28)
    _close(loss, (-1.28 + 0.8 - 2.2 - 0.5) / 4)


def _random_batch(seed, n=4, t=6):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(n, t, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    ref = logprobs.detach() + 0.3 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    advantages = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([t, t - 2, 1, 3])[:n]
    mask = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    entropy = torch.rand(n, t, generator=gen, dtype=torch.float64).requires_grad_()
    return logprobs, old, ref, advantages, mask, entropy


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_clipped_at_ratio_one_has_reinforce_gradient(aggregation):
    """With old = logprobs.detach() (ratio 1) the clipped loss has REINFORCE's gradient."""
    logprobs, _, _, advantages, mask, _ = _random_batch(0)
    clipped, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, aggregation=aggregation)
    reinforce, _ = policy_loss(
        logprobs,
        logprobs.detach(),
        advantages,
        mask,
        loss_type="reinforce",
        aggregation=aggregation,
    )
    (g_clipped,) = torch.autograd.grad(clipped, logprobs)
    (g_reinforce,) = torch.autograd.grad(reinforce, logprobs)
    torch.testing.assert_close(g_clipped, g_reinforce, rtol=1e-12, atol=1e-12)
    assert g_reinforce.abs().sum() > 0


def test_gspo_hand_values():
    """GSPO: s = exp(mean(logp - old)); e^0.2 is unclipped, e^0.6 clipped at 1.3 (eps 0.3)."""
    logprobs = _leaf([[0.0, 0.0], [0.0, 0.0]])
    old = -torch.tensor([[0.1, 0.3], [0.5, 0.7]], dtype=torch.float64)
    advantages = torch.ones(2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, stats = policy_loss(logprobs, old, advantages, mask, loss_type="gspo", eps_low=0.3)
    _close(loss, (-1.2214027581601699 - 1.3) / 2)
    _close(stats["clip/high_frac"], 0.5)
    (grad,) = torch.autograd.grad(loss, logprobs)
    # seq 0: d/dlogp_t of -s = -s / 2 tokens, / 2 sequences; seq 1 clipped: 0
    g = -1.2214027581601699 / 4
    _close(grad, [[g, g], [0.0, 0.0]])


@pytest.mark.parametrize("eps", [10.0, 0.05])
def test_gspo_token_form_equals_sequence_objective(eps):
    """GSPO-token with sequence_mean has the value and gradient of the sequence-level GSPO."""
    logprobs, old, _, advantages, mask, _ = _random_batch(1)
    loss, _ = policy_loss(logprobs, old, advantages, mask, loss_type="gspo", eps_low=eps)
    (grad,) = torch.autograd.grad(loss, logprobs)
    diff = torch.where(mask, logprobs - old, torch.zeros_like(old))
    s = torch.exp(diff.sum(1) / mask.sum(1))  # (N,) sequence ratio
    direct = -torch.min(s * advantages, s.clamp(1 - eps, 1 + eps) * advantages).mean()
    (direct_grad,) = torch.autograd.grad(direct, logprobs)
    torch.testing.assert_close(loss, direct, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, direct_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("clip_low", "low_weight"), [(False, 0.5), (True, 0.8)])
def test_cispo_hand_values_and_gradient_through_clip(clip_low, low_weight):
    """CISPO: -sg(clip(r))·A·logp; a clipped token still gets gradient -clip(r)·A."""
    logprobs = _leaf([[-1.0], [-1.0]])
    old = logprobs.detach() - torch.tensor([[0.5], [math.log(0.5)]], dtype=torch.float64)
    advantages = torch.ones(2, dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.bool)
    loss, stats = policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        loss_type="cispo",
        aggregation="token_mean",
        eps_high=0.28,
        cispo_clip_low=clip_low,
    )
    _close(loss, (1.28 + low_weight) / 2)
    _close(stats["clip/high_frac"], 0.5)
    _close(stats["clip/low_frac"], 0.5 if clip_low else 0.0)
    (grad,) = torch.autograd.grad(loss, logprobs)
    _close(grad, [[-1.28 / 2], [-low_weight / 2]])


def test_kl_and_entropy_terms_hand_values():
    """β·k3 and -c·H are aggregated like the policy term; loss = sum of the three parts."""
    logprobs = _leaf([[math.log(0.5), math.log(0.5)]])
    ref = torch.full((1, 2), math.log(0.25), dtype=torch.float64)
    entropy = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = policy_loss(
        logprobs,
        None,
        torch.zeros(1, dtype=torch.float64),
        mask,
        ref_logprobs=ref,
        beta=0.1,
        entropy=entropy,
        entropy_coeff=0.01,
    )
    _close(stats["kl/mean"], 0.1931471805599453)
    _close(stats["loss/kl"], 0.1 * 0.1931471805599453)
    _close(stats["entropy/mean"], 2.0)
    _close(stats["loss/entropy"], -0.02)
    _close(stats["loss/policy"], 0.0)
    _close(loss, 0.01931471805599453 - 0.02)


def _all_terms(logprobs, old, ref, advantages, mask, entropy, loss_type, aggregation):
    return policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        loss_type=loss_type,
        aggregation=aggregation,
        ref_logprobs=ref,
        beta=0.05,
        entropy=entropy,
        entropy_coeff=0.01,
        eps_low=0.1,
    )


@pytest.mark.parametrize("loss_type", list(POLICY_LOSSES))
@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_padding_garbage_changes_no_loss_and_no_gradient(loss_type, aggregation):
    """NaN/inf/huge values in padded slots change neither the loss nor any gradient."""
    logprobs, old, ref, advantages, mask, entropy = _random_batch(2)
    clean, _ = _all_terms(logprobs, old, ref, advantages, mask, entropy, loss_type, aggregation)
    clean_grads = torch.autograd.grad(clean, (logprobs, entropy))

    garbage = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30], dtype=torch.float64)
    fill = garbage.repeat(mask.numel())[: mask.numel()].view(mask.shape)

    def dirty(x):
        return torch.where(mask, x, fill)

    leaf_lp, leaf_ent = logprobs.detach().requires_grad_(), entropy.detach().requires_grad_()
    loss, stats = _all_terms(
        dirty(leaf_lp),
        dirty(old),
        dirty(ref),
        advantages,
        mask,
        dirty(leaf_ent),
        loss_type,
        aggregation,
    )
    grads = torch.autograd.grad(loss, (leaf_lp, leaf_ent))
    torch.testing.assert_close(loss, clean, rtol=0, atol=0)
    for grad, clean_grad in zip(grads, clean_grads, strict=True):
        torch.testing.assert_close(grad, clean_grad, rtol=0, atol=0)
        assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    assert all(torch.isfinite(v).all() for v in stats.values())


@pytest.mark.parametrize("loss_type", list(POLICY_LOSSES))
@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "sequence_sum"])
def test_extra_padding_columns_change_nothing(loss_type, aggregation):
    """Appending padded columns leaves the loss unchanged (padded equals unpadded)."""
    logprobs, old, ref, advantages, mask, entropy = _random_batch(3)
    base, _ = _all_terms(logprobs, old, ref, advantages, mask, entropy, loss_type, aggregation)

    def pad(x, value=0.0):
        return torch.cat([x, torch.full((x.shape[0], 3), value, dtype=x.dtype)], dim=1)

    padded, _ = _all_terms(
        pad(logprobs),
        pad(old),
        pad(ref),
        advantages,
        pad(mask, False),
        pad(entropy),
        loss_type,
        aggregation,
    )
    torch.testing.assert_close(padded, base, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_sequences_without_counted_tokens_give_no_nan(aggregation):
    """An all-padding sequence contributes 0; an all-padding batch gives loss 0 and no NaN."""
    logprobs, old, ref, advantages, mask, entropy = _random_batch(4)
    mask = mask.clone()
    mask[1] = False
    loss, stats = _all_terms(logprobs, old, ref, advantages, mask, entropy, "gspo", aggregation)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))
    empty = torch.zeros_like(mask)
    loss, stats = _all_terms(logprobs, old, ref, advantages, empty, entropy, "clipped", aggregation)
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())


def test_stats_are_detached_and_sum_to_loss():
    """Stats are detached 0-dim tensors and loss/policy + loss/kl + loss/entropy = loss."""
    logprobs, old, ref, advantages, mask, entropy = _random_batch(5)
    loss, stats = _all_terms(logprobs, old, ref, advantages, mask, entropy, "clipped", "token_mean")
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    assert {"clip/low_frac", "clip/high_frac", "ratio/mean", "kl/mean", "entropy/mean"} <= set(
        stats
    )
    _close(stats["loss/policy"] + stats["loss/kl"] + stats["loss/entropy"], loss.item(), rtol=1e-12)


def test_k1_in_loss_warns_towards_reward_penalty():
    """k1 with beta > 0 warns and names the reward-side alternative; k3 or beta = 0 do not."""
    logprobs, old, ref, advantages, mask, _ = _random_batch(6)
    with pytest.warns(UserWarning, match="subtract beta \\* k1 from the reward"):
        policy_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.1, kl_estimator="k1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy_loss(logprobs, old, advantages, mask, ref_logprobs=ref, beta=0.1)
        policy_loss(logprobs, old, advantages, mask, ref_logprobs=ref, kl_estimator="k1")


def test_aggregate_hand_value():
    """aggregate('token_mean') ignores padding: (1 + 2 + 4) / 3."""
    values = torch.tensor([[1.0, 2.0], [4.0, float("nan")]])
    _close(aggregate(values, torch.tensor([[True, True], [True, False]]), "token_mean"), 7 / 3)


@pytest.mark.parametrize(
    ("change", "argument", "error"),
    [
        ({"old_logprobs": torch.zeros(4, 5)}, "old_logprobs", ValueError),
        ({"advantages": torch.zeros(4, 1)}, "advantages", ValueError),
        ({"completion_mask": torch.ones(4, 5, dtype=torch.bool)}, "completion_mask", ValueError),
        ({"completion_mask": torch.ones(4, 6)}, "completion_mask", TypeError),
        ({"ref_logprobs": torch.zeros(3, 6)}, "ref_logprobs", ValueError),
        ({"entropy": torch.zeros(4)}, "entropy", ValueError),
        ({"logprobs": torch.zeros(4, 6, 1)}, "logprobs", ValueError),
        ({"loss_type": "ppo2"}, "loss_type", ValueError),
        ({"aggregation": "sum"}, "aggregation", ValueError),
        ({"kl_estimator": "k4"}, "kl_estimator", ValueError),
        ({"eps_low": -0.1}, "eps_low", ValueError),
        ({"eps_high": float("nan")}, "eps_high", ValueError),
        ({"beta": 0.1}, "ref_logprobs", ValueError),
        ({"entropy_coeff": 0.1}, "entropy", ValueError),
        (
            {"max_completion_length": 0, "aggregation": "constant_length"},
            "max_completion_length",
            ValueError,
        ),
        ({"cispo_clip_low": True}, "cispo_clip_low", ValueError),
    ],
)
def test_bad_input_names_the_argument(change, argument, error):
    """Bad shapes, dtypes, names and values raise an error whose message starts with the argument."""
    kwargs = {
        "logprobs": torch.zeros(4, 6),
        "old_logprobs": torch.zeros(4, 6),
        "advantages": torch.zeros(4),
        "completion_mask": torch.ones(4, 6, dtype=torch.bool),
    }
    kwargs.update(change)
    with pytest.raises(error, match=f"^{argument}:"):
        policy_loss(**kwargs)


def test_shape_error_shows_both_shapes():
    """A shape mismatch message shows the argument's shape and the expected one."""
    with pytest.raises(ValueError, match=r"old_logprobs: shape \(4, 5\) .* \(4, 6\)"):
        policy_loss(
            torch.zeros(4, 6), torch.zeros(4, 5), torch.zeros(4), torch.ones(4, 6, dtype=torch.bool)
        )
