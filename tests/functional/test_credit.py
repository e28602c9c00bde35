"""Tests for grpo.functional.credit: GRPO, REINFORCE and SFT as compositions."""

import pytest
import torch
import torch.nn.functional as F

from grpo.functional import ALGORITHMS, CREDIT_ASSIGNERS, LOSSES, Algorithm, compose, returns


def _batch(seed, n=4, t=5, vocab=7):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, vocab, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, vocab, (n, t), generator=gen)
    lengths = torch.tensor([5, 2, 4, 1])[:n]
    mask = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    logprobs = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (N, T)
    return logits, tokens, mask, logprobs


def test_returns_hand_values():
    """Per-step rewards [1, 2, 4] with γ = 0.5 give 1 + 1 + 1 = 3; γ = 1 gives 7."""
    rewards = torch.tensor([[1.0, 2.0, 4.0], [0.0, 0.0, 8.0]])
    torch.testing.assert_close(returns(rewards, 0.5), torch.tensor([3.0, 2.0]), rtol=1e-6, atol=0)
    torch.testing.assert_close(returns(rewards), torch.tensor([7.0, 8.0]), rtol=1e-6, atol=0)
    torch.testing.assert_close(returns(torch.tensor([2.0, -1.0])), torch.tensor([2.0, -1.0]))


def test_credit_assigners_hand_values():
    """group_normalized is seed 001's formula, monte_carlo the return, constant 1 each."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # groups of 2: [1, 0] -> mean 0.5, std sqrt(0.5) = 0.7071067811865476
    a = 0.5 / (0.7071067811865476 + 1e-4)
    grpo = CREDIT_ASSIGNERS["group_normalized"](rewards, group_size=2)
    torch.testing.assert_close(grpo, torch.tensor([a, -a, -a, a]), rtol=1e-6, atol=0)
    torch.testing.assert_close(CREDIT_ASSIGNERS["monte_carlo"](rewards), rewards)
    torch.testing.assert_close(CREDIT_ASSIGNERS["constant"](rewards), torch.ones(4))


def test_grpo_is_group_normalized_plus_reinforce():
    """GRPO composition = -mean_i[A_i · mean_t logp_it] with A from seed 001's formula."""
    _, _, mask, logprobs = _batch(0)
    rewards = torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=torch.float64)
    algorithm = compose(*ALGORITHMS["grpo"], credit_options={"group_size": 2})
    loss, _ = algorithm(logprobs, rewards, mask)
    grouped = rewards.view(2, 2)
    adv = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    per_sequence = (logprobs * mask).sum(1) / mask.sum(1)  # (N,)
    direct = -(adv.reshape(-1) * per_sequence).mean()
    torch.testing.assert_close(loss, direct, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(loss, logprobs)[0], torch.autograd.grad(direct, logprobs)[0]
    )


def test_reinforce_is_monte_carlo_plus_reinforce():
    """REINFORCE composition with per-step rewards = -mean_i[G_i · Σ_t logp_it] (seed 003 form)."""
    _, _, mask, logprobs = _batch(1)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    algorithm = compose("monte_carlo", "reinforce", {"gamma": 0.9}, {"aggregation": "sequence_sum"})
    loss, _ = algorithm(logprobs, rewards, mask)
    discounted = rewards[:, 0] + 0.9 * rewards[:, 1]  # (N,)
    direct = -(discounted * (logprobs * mask).sum(1)).mean()
    torch.testing.assert_close(loss, direct, rtol=1e-12, atol=1e-12)


def test_sft_is_constant_plus_cross_entropy():
    """SFT composition equals F.cross_entropy over the counted tokens, value and gradient."""
    logits, tokens, mask, logprobs = _batch(2)
    loss, _ = compose(*ALGORITHMS["sft"])(logprobs, torch.zeros(4), mask)
    targets = tokens.masked_fill(~mask, -100)
    direct = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(loss, direct, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(loss, logits)[0], torch.autograd.grad(direct, logits)[0]
    )


def test_clipped_loss_part_matches_policy_loss_at_ratio_one():
    """group_normalized + clipped at ratio 1 has the GRPO (reinforce) gradient."""
    _, _, mask, logprobs = _batch(3)
    rewards = torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=torch.float64)
    options = {"group_size": 2}
    clipped, _ = compose("group_normalized", "clipped", options)(
        logprobs, rewards, mask, logprobs.detach()
    )
    reinforce, _ = compose("group_normalized", "reinforce", options)(logprobs, rewards, mask)
    torch.testing.assert_close(
        torch.autograd.grad(clipped, logprobs, retain_graph=True)[0],
        torch.autograd.grad(reinforce, logprobs)[0],
    )


def test_tables_hold_the_named_parts():
    """The credit and loss tables hold exactly seed 003's parts."""
    assert set(CREDIT_ASSIGNERS) == {"group_normalized", "monte_carlo", "constant"}
    assert set(LOSSES) == {"reinforce", "clipped", "cross_entropy"}


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"credit": "td", "loss": "reinforce"}, "credit"),
        ({"credit": "constant", "loss": "dpo"}, "loss"),
        ({"credit": "group_normalized", "loss": "reinforce"}, "credit_options"),
    ],
)
def test_bad_algorithm_names_the_field(kwargs, argument):
    """Unknown parts or a missing group_size raise ValueError naming the field."""
    with pytest.raises(ValueError, match=f"^{argument}:"):
        Algorithm(**kwargs)


def test_bad_returns_input():
    """A 3-D reward tensor or γ outside [0, 1] raises ValueError naming the argument."""
    with pytest.raises(ValueError, match="^rewards:"):
        returns(torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="^gamma:"):
        returns(torch.zeros(2, 2), gamma=1.5)
