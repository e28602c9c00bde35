"""GRPOObjective: the right inputs reach the maths core; values and gradients by hand."""

import math
import warnings

import pytest
import torch
from toy_models import SequencePolicy, TablePolicy, token_count_reward

from grpo.records import ExperienceBatch
from grpo.step.collect import ExperienceCollector
from grpo.step.objective import GRPOObjective

STATES = [0, 1, 2]
ACTIONS = [[0, 2], [1, 1], [2, 0]]  # (B, G) = (3, 2)
ADVANTAGES = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])  # (N,)


def _batch(policy):
    """A batch whose old log-probs are the policy's current ones (ratio 1)."""
    flat_states = [s for s in STATES for _ in range(2)]
    flat_actions = [a for g in ACTIONS for a in g]
    old = policy.get_log_probabilities(flat_states, flat_actions).detach().view(3, 2)
    return ExperienceBatch(STATES, ACTIONS, [[0.0, 0.0]] * 3, old.tolist())


def test_gradient_at_ratio_one_is_the_policy_gradient():
    """At ratio 1, ∇L = -(1/N) Σ_n A_n (onehot(a_n) - softmax(logits[s_n])), exactly."""
    policy = TablePolicy(3, 3, seed=0)
    objective = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.0)
    out = objective.compute_loss(policy, None, _batch(policy), ADVANTAGES)
    out["total_loss"].backward()
    probs = torch.softmax(policy.logits.detach(), -1)
    expected = torch.zeros(3, 3)
    flat = [(s, a) for s, g in zip(STATES, ACTIONS, strict=True) for a in g]
    for (s, a), adv in zip(flat, ADVANTAGES.tolist(), strict=True):
        expected[s] -= adv * (torch.nn.functional.one_hot(torch.tensor(a), 3) - probs[s]) / 6
    torch.testing.assert_close(policy.logits.grad, expected, rtol=1e-5, atol=1e-7)
    assert out["total_loss"].item() == pytest.approx(-ADVANTAGES.mean().item(), abs=1e-7)
    assert out["kl_penalty"].item() == 0.0 and out["entropy_bonus"].item() == 0.0


def test_clipped_and_reinforce_agree_at_ratio_one():
    """Selecting loss_type='reinforce' gives the same gradient as 'clipped' when on-policy."""
    grads = []
    for loss_type in ("clipped", "reinforce"):
        policy = TablePolicy(3, 3, seed=0)
        GRPOObjective(loss_type=loss_type, kl_coeff=0.0, entropy_coeff=0.0).compute_loss(
            policy, None, _batch(policy), ADVANTAGES
        )["total_loss"].backward()
        grads.append(policy.logits.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=0)


def test_kl_penalty_is_k3_against_the_reference():
    """kl_penalty = λ · mean_n [exp(ref - lp) - (ref - lp) - 1] with the reference's log-probs."""
    policy, reference = TablePolicy(3, 3, seed=0), TablePolicy(3, 3, seed=1)
    batch = _batch(policy)
    out = GRPOObjective(kl_coeff=0.5, entropy_coeff=0.0).compute_loss(
        policy, reference, batch, ADVANTAGES
    )
    lp = policy.get_log_probabilities(batch.flat_states(), batch.flat_actions()).tolist()
    ref = reference.get_log_probabilities(batch.flat_states(), batch.flat_actions()).tolist()
    k3 = [math.exp(r - p) - (r - p) - 1 for p, r in zip(lp, ref, strict=True)]
    assert out["kl_penalty"].item() == pytest.approx(0.5 * sum(k3) / 6, rel=1e-5)
    total = out["policy_loss"] + out["kl_penalty"] - out["entropy_bonus"]
    assert out["total_loss"].item() == pytest.approx(total.item(), rel=1e-6)
    assert reference.logits.grad is None  # scored under no_grad


class Untouchable(TablePolicy):
    """A reference that must never be scored."""

    def get_log_probabilities(self, states, actions):
        raise AssertionError("reference policy was evaluated")


def test_reference_skipped_when_kl_off_or_missing():
    """kl_coeff=0 never scores the reference; reference None gives a zero KL term."""
    policy = TablePolicy(3, 3)
    out = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.0).compute_loss(
        policy, Untouchable(3, 3), _batch(policy), ADVANTAGES
    )
    assert out["kl_penalty"].item() == 0.0
    out = GRPOObjective(kl_coeff=0.1, entropy_coeff=0.0).compute_loss(
        policy, None, _batch(policy), ADVANTAGES
    )
    assert out["kl_penalty"].item() == 0.0


def test_entropy_bonus_uses_reported_entropy():
    """entropy_bonus = β · mean_n (Σ_t H_nt / |o_n|) from TokenLogProbs.entropy."""
    torch.manual_seed(0)
    policy = SequencePolicy(2, 3, max_length=3)
    batch = ExperienceCollector(policy, token_count_reward(), 3).collect_experiences([0, 1])
    out = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.1).compute_loss(
        policy, None, batch, torch.zeros(6)
    )
    logp = torch.log_softmax(policy.logits.detach(), -1)  # (S, L, V)
    entropy = -(logp.exp() * logp).sum(-1)  # (S, L)
    per_seq = [
        entropy[s, : len(a)].mean().item()
        for s, a in zip(batch.flat_states(), batch.flat_actions(), strict=True)
    ]
    assert out["entropy_bonus"].item() == pytest.approx(0.1 * sum(per_seq) / 6, rel=1e-5)
    assert out["ratio/mean"].item() == pytest.approx(1.0, abs=1e-6)


def test_missing_entropy_warns_once_and_adds_nothing():
    """A policy without entropy gets a zero bonus and one warning, not one per call."""
    policy = TablePolicy(3, 3)
    objective = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.5)
    with pytest.warns(UserWarning, match="reports no entropy"):
        out = objective.compute_loss(policy, None, _batch(policy), ADVANTAGES)
    assert out["entropy_bonus"].item() == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        objective.compute_loss(policy, None, _batch(policy), ADVANTAGES)


def test_advantages_of_wrong_length_rejected():
    """Advantages must have one entry per sampled action."""
    policy = TablePolicy(3, 3)
    with pytest.raises(ValueError, match=r"advantages: expected shape \(6,\).*got \(5,\)"):
        GRPOObjective().compute_loss(policy, None, _batch(policy), ADVANTAGES[:5])


def test_token_logprobs_trimmed_to_a_shorter_mini_batch():
    """Scoring a subset of short sequences reuses the rollout's wider (N, T) old log-probs."""
    torch.manual_seed(3)
    policy = SequencePolicy(2, 3, max_length=4)
    batch = ExperienceCollector(policy, token_count_reward(), 4).collect_experiences([0, 1])
    short = [
        n for n, a in enumerate(batch.flat_actions()) if len(a) < batch.completion_mask.shape[1]
    ]
    assert short, "seed must give at least one sequence shorter than the longest"
    sub = ExperienceBatch(
        [batch.flat_states()[n] for n in short],
        [[batch.flat_actions()[n]] for n in short],
        [[0.0]] * len(short),
        [[0.0]] * len(short),
        batch.old_token_logprobs[short],
        batch.completion_mask[short],
    )
    out = GRPOObjective(kl_coeff=0.0).compute_loss(policy, None, sub, torch.ones(len(short)))
    assert out["ratio/mean"].item() == pytest.approx(1.0, abs=1e-6)


class _Fixed:
    """A per-action policy whose log-probs of actions 0, 1 are a parameter."""

    def __init__(self, logprobs):
        self.logprobs = torch.nn.Parameter(torch.tensor(logprobs))

    def get_log_probabilities(self, states, actions):
        return self.logprobs[torch.tensor(actions)]  # (N,)


def _stale_samples(sampler_probs):
    """Two samples of one state: π_old = (0.5, 0.25), advantages (+1, -1), sampler's q given."""
    from grpo.records import Rollout

    return Rollout(
        states=[0, 0], actions=[0, 1], rewards=torch.zeros(2),
        advantages=torch.tensor([1.0, -1.0]),
        old_logprobs=torch.tensor([[0.5], [0.25]]).log(),
        completion_mask=torch.ones(2, 1, dtype=torch.bool),
        sampler_logprobs=None if sampler_probs is None else torch.tensor(sampler_probs).log()[:, None],
    )  # fmt: skip


@pytest.mark.parametrize(("cap", "expected"), [(1.5, -0.65), (None, -0.95)])
def test_decoupled_loss_of_a_stale_sample_by_hand(cap, expected):
    """ρ = π/π_old = (1.5, 1), clipped at 1.2 for A > 0; w = min(π_old/q, cap) = (cap or 2, 0.5):
    L = mean(-w ⋅ min(ρA, clip(ρ)A)) = (-1.2 w_0 + 0.5) / 2; ∇ log π = (0, 0.25) (first clipped)."""
    policy = _Fixed([math.log(0.75), math.log(0.25)])  # π = 1.5 π_old, 1.0 π_old
    objective = GRPOObjective(
        clip_epsilon=0.2, kl_coeff=0.0, entropy_coeff=0.0, aggregation="token_mean", tis_cap=cap
    )
    out = objective.loss(policy, None, _stale_samples([0.25, 0.5]))
    out["total_loss"].backward()
    assert out["total_loss"].item() == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(policy.logprobs.grad, torch.tensor([0.0, 0.25]), rtol=1e-6, atol=0)


def test_decoupled_loss_equals_the_standard_one_when_the_sampler_is_pi_old():
    """Sampler log-probs equal to π_old: weights exactly 1, the same loss and gradient bit for bit."""
    grads, losses = [], []
    for sampler in (None, [0.5, 0.25]):
        policy = _Fixed([math.log(0.75), math.log(0.25)])
        objective = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.0, tis_cap=1.5)
        out = objective.loss(policy, None, _stale_samples(sampler))
        out["total_loss"].backward()
        grads.append(policy.logprobs.grad)
        losses.append(out["total_loss"])
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])


def test_the_kl_term_of_a_stale_batch_carries_no_importance_weight():
    """docs/async.md: only the policy term is weighed by π_old / π_sampler. With weights (2, 0.5)
    on a stale batch, k3 per sample and its gradient are the unweighted ones, by hand:
    k3 = r - log r - 1 with r = π_ref / π, ∂k3/∂log π = 1 - r; A = 0, so the policy term has
    no gradient and the whole gradient is β · mean(1 - r)."""
    beta, ref = 0.5, [math.log(0.25), math.log(0.5)]  # π = (0.75, 0.25): r = (1/3, 2)
    samples = _stale_samples([0.25, 0.5])._replace(advantages=torch.zeros(2))
    outs, grads = [], []
    for batch in (samples, samples._replace(sampler_logprobs=None)):  # stale, then fresh
        policy, reference = _Fixed([math.log(0.75), math.log(0.25)]), _Fixed(ref)
        objective = GRPOObjective(kl_coeff=beta, entropy_coeff=0.0, aggregation="token_mean")
        outs.append(objective.loss(policy, reference, batch))
        outs[-1]["total_loss"].backward()
        grads.append(policy.logprobs.grad)
    stale, fresh = outs
    assert stale["importance_weight/mean"].item() == pytest.approx(1.25)  # (2 + 0.5) / 2
    r = torch.tensor([1 / 3, 2.0])
    k3 = r - r.log() - 1
    assert stale["kl/mean"].item() == pytest.approx(k3.mean().item(), rel=1e-6)
    assert stale["loss/kl"].item() == pytest.approx(beta * k3.mean().item(), rel=1e-6)
    torch.testing.assert_close(grads[0], beta * (1 - r) / 2, rtol=1e-6, atol=0)
    assert torch.equal(grads[0], grads[1]) and torch.equal(stale["loss/kl"], fresh["loss/kl"])
