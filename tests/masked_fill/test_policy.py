"""Tests for grpo/masked_fill/policy.py (and its judge reward, grpo/masked_fill/judge.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import grpo.precision
from grpo.masked_fill.judge import TokenJudgeReward
from grpo.masked_fill.policy import MaskedFillConfig, MaskedFillPolicy

PAD, MASK = 0, 1


class FixedLogits(nn.Module):
    """A user module whose logits are its own parameter, whatever the ids: (1 or N, T, V)."""

    def __init__(self, logits: Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())
        self.seen: list[Tensor] = []

    def forward(self, ids: Tensor) -> Tensor:
        self.seen.append(ids.clone())
        return self.logits.expand(ids.shape[0], -1, -1)[:, : ids.shape[1]]


class CopyFirstToken(nn.Module):
    """Deterministic fill: every position predicts the state's first token (logit 50)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, ids: Tensor) -> Tensor:
        onehot = nn.functional.one_hot(ids[:, :1], self.vocab).float()  # (N, 1, V)
        return 50.0 * onehot.expand(-1, ids.shape[1], -1) + self.unused


def policy_for(logits: Tensor, **config) -> MaskedFillPolicy:
    return MaskedFillPolicy(FixedLogits(logits), MaskedFillConfig(mask_token_id=MASK, **config))


def test_logprobs_hand_computed_with_sampling_temperature():
    """Token log-prob = log softmax(logits / temperature)[token], by hand; other positions 0."""
    logits = torch.tensor([[[0.0, 0.0, 2.0, 0.5, -1.0], [0.0, 0.0, 1.0, 1.0, 1.0]]])  # (1, 2, 5)
    policy = policy_for(logits, temperature=0.5)
    out = policy.get_token_log_probabilities([[MASK, 4]], [[3, 4]])
    z = [0.0, 0.0, 4.0, 1.0, -2.0]
    expected = z[3] - math.log(sum(math.exp(v) for v in z))
    torch.testing.assert_close(out.logprobs, torch.tensor([[expected, 0.0]]), rtol=1e-6, atol=0)
    assert out.completion_mask.tolist() == [[True, False]]
    at_t1 = 0.5 - math.log(2 + math.exp(2.0) + math.exp(0.5) + math.exp(-1.0))
    assert abs(expected - at_t1) > 0.1  # the temperature matters for this example


def test_sampling_frequencies_match_exp_logprobs():
    """Sampled fill frequencies equal exp(log-prob) at the same temperature (and not at 1)."""
    logits = torch.tensor([[[1.0, 0.0, -0.5]]])  # (1, 1, V=3), mask id 1 is a normal token here
    policy = policy_for(logits, temperature=0.5)
    policy.generator = torch.Generator().manual_seed(0)
    n = 20000
    actions = policy.generate_actions([[MASK]], n)[0]
    freq = torch.bincount(torch.stack(actions)[:, 0], minlength=3).double() / n
    probs = (
        torch.stack([policy.get_log_probabilities([[MASK]], [[v]]).exp() for v in range(3)])
        .squeeze(-1)
        .double()
    )
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.01)
    assert (freq - torch.softmax(logits[0, 0].double(), -1)).abs().max() > 0.1


def test_sampling_stays_in_the_top_p_nucleus():
    """top_p 0.7 of (0.1, 0.5, 0.15, 0.25) samples only tokens 1 and 3, in ratio 0.5 : 0.25."""
    probs = torch.tensor([[0.1, 0.5, 0.15, 0.25]])
    logits = torch.log(probs)[None]  # (1, 1, 4)
    policy = policy_for(logits, top_p=0.7)
    policy.generator = torch.Generator().manual_seed(1)
    tokens = torch.stack(policy.generate_actions([[MASK]], 4000)[0])[:, 0]
    assert set(tokens.tolist()) == {1, 3}
    assert abs((tokens == 1).double().mean().item() - 0.5 / 0.75) < 0.03


def test_unmasked_logits_change_nothing_and_get_zero_gradient():
    """Log-probs depend on masked positions only; unmasked logits get an exactly zero gradient."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    states = [[2, MASK, 3, MASK], [MASK, 4, 5, 2]]
    actions = [[2, 0, 3, 5], [4, 4, 5, 2]]
    policy = policy_for(logits, temperature=0.7)
    lp = policy.get_log_probabilities(states, actions)
    mask = torch.tensor(states) == MASK  # (N, T)
    perturbed = logits + 10.0 * torch.randn(logits.shape, generator=gen, dtype=torch.float64) * (
        ~mask
    ).unsqueeze(-1)
    assert torch.equal(
        policy_for(perturbed, temperature=0.7).get_log_probabilities(states, actions), lp
    )
    lp.sum().backward()
    grad = policy.model.logits.grad  # (N, T, V)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    # masked positions: d log p(a) / d z = (onehot(a) - softmax(z / tau)) / tau
    onehot = nn.functional.one_hot(torch.tensor(actions), 6).double()
    expected = (onehot - torch.softmax(logits / 0.7, -1)) / 0.7
    torch.testing.assert_close(grad[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_sum_and_mean_reductions_over_masked_positions():
    """get_log_probabilities sums (or averages) the token log-probs of masked positions only."""
    logits = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(2))
    states, actions = [[MASK, 2, MASK]], [[3, 2, 4]]
    token = policy_for(logits).get_token_log_probabilities(states, actions).logprobs
    total = token[0, 0] + token[0, 2]
    torch.testing.assert_close(
        policy_for(logits).get_log_probabilities(states, actions), total[None]
    )
    mean = policy_for(logits, reduction="mean").get_log_probabilities(states, actions)
    torch.testing.assert_close(mean, total[None] / 2)


def test_suppressed_tokens_have_probability_zero():
    """Suppressed ids are never sampled and the rest renormalise: log-probs by hand."""
    logits = torch.zeros(1, 1, 4)
    policy = policy_for(logits, suppress_token_ids=(PAD, MASK), compute_entropy=True)
    tokens = torch.stack(policy.generate_actions([[MASK]], 500)[0])[:, 0]
    assert set(tokens.tolist()) <= {2, 3}
    out = policy.get_token_log_probabilities([[MASK]], [[2]])
    torch.testing.assert_close(out.logprobs, torch.tensor([[math.log(0.5)]]))
    torch.testing.assert_close(out.entropy, torch.tensor([[math.log(2.0)]]))


def test_sampling_never_changes_unmasked_positions_of_a_masked_lm(tiny_bert):
    """An AutoModelForMaskedLM fills masked positions only; padding-free lengths are kept."""
    policy = MaskedFillPolicy(
        tiny_bert, MaskedFillConfig(mask_token_id=MASK, pad_token_id=PAD, suppress_token_ids=(0, 1))
    )
    gen = torch.Generator().manual_seed(3)
    states = []
    for length in (5, 9, 7):
        state = torch.randint(2, 12, (length,), generator=gen)
        state[torch.rand(length, generator=gen) < 0.5] = MASK
        states.append(state)
    groups = policy.generate_actions(states, 4)
    for state, group in zip(states, groups, strict=True):
        for action in group:
            keep = state != MASK
            assert action.shape == state.shape
            assert torch.equal(action[keep], state[keep])
            assert not bool((action[~keep] < 2).any())  # filled with real tokens
    flat_states = [s for s in states for _ in range(4)]
    logprobs = policy.get_token_log_probabilities(flat_states, [a for g in groups for a in g])
    assert torch.equal(logprobs.completion_mask[0, :5], states[0] == MASK)
    assert not bool(logprobs.completion_mask[0, 5:].any())  # padding is never counted


def test_group_repetition_keeps_copies_together_in_order():
    """Sample n = i * G + j is a fill of state i: the model sees each state G times in a row."""
    model = CopyFirstToken(vocab=8)
    policy = MaskedFillPolicy(model, MaskedFillConfig(mask_token_id=MASK))
    states = [[5, MASK, 2], [3, MASK, MASK], [7, 4, MASK]]
    groups = policy.generate_actions(states, 3)
    assert [[a.tolist() for a in g] for g in groups] == [
        [[5, 5, 2]] * 3,
        [[3, 3, 3]] * 3,
        [[7, 4, 7]] * 3,
    ]
    policy.model = seen = FixedLogits(torch.zeros(1, 3, 8))
    policy.generate_actions(states, 2)
    assert torch.equal(seen.seen[0], torch.tensor(states).repeat_interleave(2, dim=0))


def test_reference_is_a_frozen_copy():
    """make_reference copies the weights, freezes them and ignores later policy updates."""
    logits = torch.randn(1, 2, 5, generator=torch.Generator().manual_seed(4))
    policy = policy_for(logits)
    reference = policy.make_reference()
    assert reference.get_parameters() == {}
    assert not any(p.requires_grad for p in reference.model.parameters())
    before = reference.get_log_probabilities([[MASK, MASK]], [[2, 3]])
    with torch.no_grad():
        policy.model.logits.add_(1.0 * torch.arange(5.0))
    reference.train()
    assert not reference.model.training
    assert torch.equal(reference.get_log_probabilities([[MASK, MASK]], [[2, 3]]), before)
    assert not torch.equal(policy.get_log_probabilities([[MASK, MASK]], [[2, 3]]), before)


def test_bad_inputs_raise_clear_errors():
    """Invalid config fields, changed unmasked tokens and unpadded ragged inputs are refused."""
    with pytest.raises(ValueError, match="temperature=0"):
        MaskedFillConfig(mask_token_id=MASK, temperature=0)
    with pytest.raises(ValueError, match="reduction='max'"):
        MaskedFillConfig(mask_token_id=MASK, reduction="max")
    policy = policy_for(torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match=r"actions\[1\] differs"):
        policy.get_log_probabilities([[MASK, 2], [MASK, 2]], [[3, 2], [3, 4]])
    with pytest.raises(ValueError, match="pad_token_id"):
        policy.generate_actions([[MASK, 2], [MASK]], 2)
    with pytest.raises(ValueError, match="pad_token_id=1 equals mask_token_id"):
        MaskedFillConfig(mask_token_id=MASK, pad_token_id=MASK)


def test_an_action_of_another_length_than_its_state_is_refused_by_row():
    """Padding would hide a short (or long) action: each row's lengths are compared."""
    policy = policy_for(torch.zeros(1, 4, 5), pad_token_id=PAD)
    states = [[MASK, MASK], [2, 3, 4, MASK]]
    with pytest.raises(ValueError, match=r"actions\[0\] has 1 tokens, states\[0\] 2"):
        policy.get_token_log_probabilities(states, [[3], [2, 3, 4, 4]])
    with pytest.raises(ValueError, match=r"actions\[1\] has 3 tokens, states\[1\] 4"):
        policy.get_token_log_probabilities(states, [[3, 3], [2, 3, 4]])
    with pytest.raises(ValueError, match=r"actions\[0\] has 3 tokens, states\[0\] 2"):
        policy.get_token_log_probabilities(states, [[3, 3, 3], [2, 3, 4, 4]])


def test_states_without_a_masked_position_are_their_own_actions():
    """Nothing to fill: each action is its state, with log-prob 0 (no model call needed)."""
    model = FixedLogits(torch.zeros(1, 3, 5))
    policy = MaskedFillPolicy(model, MaskedFillConfig(mask_token_id=MASK, pad_token_id=PAD))
    [[first, second]] = policy.generate_actions([[2, 3, 4]], 2)
    assert first.tolist() == second.tolist() == [2, 3, 4] and model.seen == []
    assert policy.get_log_probabilities([[2, 3, 4]], [first]).tolist() == [0.0]


class AttendsToPadding(nn.Module):
    """Bidirectional toy: every position's logits are scaled by the mean of the real tokens'
    ids, which padding would shift unless the module is told where it is (attention_mask)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        real = attention_mask.float()  # (N, T)
        mean = (ids * real).sum(-1, keepdim=True) / real.sum(-1, keepdim=True)  # (N, 1)
        return self.table[ids] * mean[..., None]  # (N, T, V)


def test_a_users_module_that_takes_attention_mask_gets_it():
    """A state scores the same alone and padded beside a longer one when the user's module
    takes attention_mask: the policy passes the padding mask to it."""
    policy = MaskedFillPolicy(
        AttendsToPadding(6), MaskedFillConfig(mask_token_id=MASK, pad_token_id=PAD)
    )
    alone = policy.get_token_log_probabilities([[MASK, 2]], [[3, 2]]).logprobs
    padded = policy.get_token_log_probabilities([[MASK, 2], [MASK, 2, 4, 5]], [[3, 2], [3, 2, 4, 5]])
    torch.testing.assert_close(padded.logprobs[:1, :2], alone, rtol=0, atol=1e-6)


def test_judge_reward_is_frozen_and_scores_each_sequence():
    """TokenJudgeReward returns judge(ids) per row, under no_grad, and train() keeps it frozen."""
    judge = nn.Sequential(nn.Embedding(6, 1), nn.Flatten(), nn.Linear(3, 1))
    reward = TokenJudgeReward(judge, batch_size=2).train()
    actions = [torch.tensor([2, 3, 4]), torch.tensor([5, 5, 5]), torch.tensor([2, 2, 2])]
    rewards = reward.compute_rewards([None] * 3, actions)
    with torch.no_grad():
        expected = judge(torch.stack(actions))[:, 0]
    torch.testing.assert_close(rewards, expected, rtol=0, atol=0)
    assert not rewards.requires_grad and not judge.training
    assert not any(p.requires_grad for p in judge.parameters())


class MeanRealId(nn.Module):
    """A judge scoring a sequence by the mean of its real tokens' ids (padding left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        real = attention_mask.float()  # (N, T)
        return (ids * real).sum(-1) / real.sum(-1) + self.unused  # (N,)


def test_judge_that_takes_attention_mask_is_told_where_padding_is():
    """Sequences of different lengths, padded together: a judge taking attention_mask scores
    each as alone (padding with id 0 would pull the short one's mean down)."""
    reward = TokenJudgeReward(MeanRealId(), pad_token_id=0, batch_size=3)
    scores = reward.score_sequences([[2, 3], [4, 4, 4, 4], [5]])
    assert scores.tolist() == [2.5, 4.0, 5.0]


K = 4  # ordinary tokens 2..5 follow the chain x_t = x_{t-1} + 1 (mod K) in "real" sequences


class ChainJudge(nn.Module):
    """Frozen judge: the share of transitions that follow the chain, from a fixed (V, V) table."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.zeros(2 + K, 2 + K)
        for a in range(K):
            table[2 + a, 2 + (a + 1) % K] = 1.0
        self.table = nn.Parameter(table)

    def forward(self, ids: Tensor) -> Tensor:
        return self.table[ids[:, :-1], ids[:, 1:]].mean(-1)  # (N,)


class ConvFill(nn.Module):
    """A tiny bidirectional fill model: two width-3 convolutions over token embeddings."""

    def __init__(self, vocab: int = 2 + K, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.conv1 = nn.Conv1d(width, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, padding=1)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.embed(ids).transpose(1, 2)  # (N, D, T)
        h = torch.relu(self.conv2(torch.relu(self.conv1(h)))).transpose(1, 2)  # (N, T, D)
        return self.head(h)  # (N, T, V)


def chain_states(count: int, seed: int, length: int = 8) -> list[Tensor]:
    """Real chains with two masked positions each."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, K, (count, 1), generator=gen)
    ids = 2 + (start + torch.arange(length)) % K  # (count, length)
    masked = torch.rand(count, length, generator=gen).argsort(-1)[:, :2]  # (count, 2)
    ids.scatter_(1, masked, MASK)
    return list(ids)


def held_out_score(policy: MaskedFillPolicy, judge: TokenJudgeReward, states) -> float:
    actions = [a for group in policy.generate_actions(states, 8) for a in group]
    return judge.compute_rewards([None] * len(actions), actions).mean().item()


def test_short_grpo_run_raises_held_out_judge_score_and_freezes_judge_and_reference():
    """GRPOTrainer raises the judge score on held-out inputs; judge and reference never change."""
    from grpo.config import GRPOConfig
    from grpo.step.trainer import GRPOTrainer

    torch.manual_seed(0)
    config = MaskedFillConfig(mask_token_id=MASK, suppress_token_ids=(PAD, MASK))
    policy = MaskedFillPolicy(ConvFill(), config)
    judge = TokenJudgeReward(ChainJudge())
    train_states, held_out = chain_states(256, seed=1), chain_states(64, seed=2)
    grpo_config = GRPOConfig(
        group_size=8, batch_size=64, num_epochs_per_update=1, kl_coeff=0.01,
        entropy_coeff=0.0, ref_update_frequency=0, learning_rate=3e-3,
    )  # fmt: skip
    trainer = GRPOTrainer(policy, judge, config=grpo_config)
    judge_before = {k: v.clone() for k, v in judge.judge.state_dict().items()}
    reference_before = {k: v.clone() for k, v in trainer.reference_policy.state_dict().items()}
    before = held_out_score(policy, judge, held_out)
    for step in range(30):
        metrics = trainer.train_step(train_states[(step * 16) % 256 :][:16])
    after = held_out_score(policy, judge, held_out)
    assert after > before + 0.25, (before, after)
    assert metrics["kl/mean"] > 0
    for name, value in judge.judge.state_dict().items():
        assert torch.equal(value, judge_before[name])
    for name, value in trainer.reference_policy.state_dict().items():
        assert torch.equal(value, reference_before[name])


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A 1-layer BERT masked LM with random weights, saved and reloaded via AutoModelForMaskedLM."""
    from transformers import AutoModelForMaskedLM, BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, pad_token_id=PAD,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny_bert")
    BertForMaskedLM(config).save_pretrained(path)
    return AutoModelForMaskedLM.from_pretrained(path)


def dropout_bert(attn_implementation: str) -> nn.Module:
    """A 1-layer BERT masked LM, random weights, dropout 0.5 on hidden states and attention."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, pad_token_id=PAD,
        hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5,
    )  # fmt: skip
    config._attn_implementation = attn_implementation
    return BertForMaskedLM(config)


class MeanId(nn.Module):
    """A parameter-free judge: the mean token id of the filled sequence."""

    def forward(self, ids: Tensor) -> Tensor:
        return ids.float().mean(-1)  # (N,)


def first_step(attn_implementation: str, disable_dropout: bool) -> tuple[MaskedFillPolicy, dict]:
    """A dropout-0.5 BERT policy after one GRPO step of one mini-batch (N = 16): its metrics."""
    from grpo.config import GRPOConfig
    from grpo.step.trainer import GRPOTrainer

    policy = MaskedFillPolicy(
        dropout_bert(attn_implementation),
        MaskedFillConfig(
            mask_token_id=MASK, suppress_token_ids=(PAD, MASK), disable_dropout=disable_dropout
        ),
    )
    gen = torch.Generator().manual_seed(5)
    states = [torch.randint(2, 12, (8,), generator=gen) for _ in range(4)]
    for state in states:
        state[torch.randperm(8, generator=gen)[:3]] = MASK
    config = GRPOConfig(
        group_size=4, batch_size=16, num_epochs_per_update=1, kl_coeff=0.0, entropy_coeff=0.0,
        ref_update_frequency=0, learning_rate=1e-3, skip_zero_advantage=False,
    )  # fmt: skip
    trainer = GRPOTrainer(policy, TokenJudgeReward(MeanId(), pad_token_id=PAD), config=config)
    return policy, trainer.train_step(states)  # its only pass is at π = π_old


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_ratio_is_exactly_one_before_any_update_despite_dropout(attn_implementation):
    """With dropout 0.5, the gradient pass scores exactly what the rollout scored: ratio 1, no clip."""
    policy, metrics = first_step(attn_implementation, disable_dropout=True)
    assert metrics["ratio/mean"] == 1.0
    assert metrics["clip/low_frac"] == 0.0 and metrics["clip/high_frac"] == 0.0
    # directly: a training-mode pass with gradient equals an eval-mode no-grad pass
    states = [torch.tensor([2, MASK, 5, MASK, 7, 3])] * 8
    actions = [a for group in policy.generate_actions(states, 1) for a in group]
    policy.train()
    with_grad = policy.get_token_log_probabilities(states, actions).logprobs
    assert policy.model.training  # the mode the trainer set is restored after the pass
    policy.eval()
    with torch.no_grad():
        old = policy.get_token_log_probabilities(states, actions).logprobs
    assert torch.equal(with_grad.detach(), old)
    # the same step with dropout left on in the gradient pass: the ratio is noise
    assert first_step(attn_implementation, disable_dropout=False)[1]["ratio/mean"] != 1.0


@pytest.mark.parametrize("spelling", [{"precision": "bf16-mixed"}, {"autocast_dtype": "bfloat16"}])
def test_bf16_mixed_scores_float32_logprobs_of_bfloat16_logits_on_a_cpu(spelling):
    """precision bf16-mixed (or the older autocast_dtype='bfloat16') runs the model's linear
    layers in bfloat16 on a CPU too; log-probs are the float32 log-softmax of those logits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(6, 8), nn.Linear(8, 6))
    config = MaskedFillConfig(mask_token_id=MASK, **spelling)
    assert config.precision == "bf16-mixed" and config.autocast_dtype is None
    policy = MaskedFillPolicy(model, config)
    states, actions = [[MASK, 2, MASK]], [[3, 2, 5]]
    out = policy.get_token_log_probabilities(states, actions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.tensor(states))  # (1, 3, 6)
    assert logits.dtype == torch.bfloat16 and out.logprobs.dtype == torch.float32
    expected = logits.float().log_softmax(-1)[0, [0, 2], [3, 5]]
    torch.testing.assert_close(out.logprobs[0, [0, 2]], expected, rtol=0, atol=0)
    fp32 = MaskedFillPolicy(model, MaskedFillConfig(mask_token_id=MASK))
    gap = (fp32.get_token_log_probabilities(states, actions).logprobs - out.logprobs).abs().max()
    assert 0 < gap < 0.05


@pytest.mark.parametrize("speedup, chosen", [(2.3, "bf16-mixed"), (0.14, "fp32")])
def test_auto_precision_is_resolved_for_the_models_device(monkeypatch, speedup, chosen):
    """MaskedFillConfig.precision auto becomes bf16-mixed or fp32 by the CPU's bfloat16 speed
    when the policy is built."""
    monkeypatch.setattr(grpo.precision, "bfloat16_speedup", lambda: speedup)
    config = MaskedFillConfig(mask_token_id=MASK, precision="auto")
    policy = MaskedFillPolicy(CopyFirstToken(4), config)
    assert policy.config.precision == chosen
