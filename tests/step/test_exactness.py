"""Exactness of the step's shortcuts and denominators (grpo.step.trainer, grpo.step.minibatch).

- The loss of an optimizer step is averaged over the whole step: k micro-batches
  (gradient accumulation) give the update of one concatenated batch, for every
  aggregation, token-level included (DAPO's denominator is the step's tokens).
- Skipping zero-advantage samples changes nothing but the work done; skipping
  them "always", with a KL term, drops exactly their KL term.
- Dynamic sampling trains only on informative groups, and its cap ends a step
  that cannot fill.

Updates are compared with plain SGD (lr 1, no clipping), where the parameter
change is exactly minus the gradient, and with Adam over several steps.
"""

from __future__ import annotations

import pytest
import torch
from toy_models import FunctionReward, SequencePolicy

from grpo.config import GRPOConfig
from grpo.functional.losses import AGGREGATIONS
from grpo.step.trainer import GRPOTrainer

S, G, L, V = 6, 4, 5, 4  # states per step, group size, max tokens, vocabulary


class CountedPolicy(SequencePolicy):
    """SequencePolicy that also reports its loss token counts without scoring."""

    sampler_is_scorer = True

    def loss_token_counts(self, states, actions):
        return torch.tensor([len(a) for a in actions])


def reward(state: int, action: tuple[int, ...]) -> float:
    """Even states: the count of token 1 (varies within a group); odd states: always 1."""
    return float(sum(t == 1 for t in action)) if state % 2 == 0 else 1.0


def run(policy_cls, steps: int = 1, optimizer: str = "sgd", **fields) -> tuple[torch.Tensor, list]:
    """Parameters after `steps` steps on states 0..S-1, from seed 0."""
    torch.manual_seed(0)
    policy = policy_cls(num_states=S, vocab_size=V, max_length=L, seed=1)
    config = GRPOConfig(**{"group_size": G, "kl_coeff": 0.0, "entropy_coeff": 0.0,
                           "max_grad_norm": None, "num_epochs_per_update": 1, **fields})  # fmt: skip
    make = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=1.0),
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.05),
    }[optimizer]
    trainer = GRPOTrainer(policy, FunctionReward(reward), make, config)
    history = [trainer.train_step(list(range(S))) for _ in range(steps)]
    return policy.logits.detach().clone(), history


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("micro_batches", [2, 3, 4])
def test_k_micro_batches_give_the_one_batch_update(aggregation, micro_batches):
    """batch_size N/k with k accumulation steps updates exactly as one batch of N (1e-6)."""
    N = S * G
    extra = {"max_completion_length": L} if aggregation == "constant_length" else {}
    one, _ = run(SequencePolicy, aggregation=aggregation, batch_size=N, **extra)
    split, history = run(
        SequencePolicy, aggregation=aggregation, batch_size=N // micro_batches,
        gradient_accumulation_steps=micro_batches, **extra,
    )  # fmt: skip
    start = SequencePolicy(num_states=S, vocab_size=V, max_length=L, seed=1).logits.detach()
    assert history[0]["optimizer_steps"] == 1
    assert (one - start).abs().max() > 1e-3  # the update is not trivially zero
    torch.testing.assert_close(split, one, rtol=0, atol=1e-6)


def test_token_mean_weighs_every_token_of_the_step_equally():
    """With token_mean, a micro-batch of short completions gets no more weight per token:
    the accumulated loss equals the token-weighted mean over the whole step."""
    _, one = run(SequencePolicy, aggregation="token_mean", batch_size=S * G)
    _, split = run(SequencePolicy, aggregation="token_mean", batch_size=S * G // 4,
                   gradient_accumulation_steps=4)  # fmt: skip
    assert split[0]["step_loss"] == pytest.approx(one[0]["step_loss"], abs=1e-7)


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("policy_cls", [SequencePolicy, CountedPolicy])
def test_skipping_zero_advantage_samples_keeps_the_update(aggregation, policy_cls):
    """Three Adam steps with 2 mini-batches each: the same parameters with and without
    skipping (1e-6), and the skipped share is the zero-advantage share."""
    extra = {"max_completion_length": L} if aggregation == "constant_length" else {}
    fields = dict(aggregation=aggregation, batch_size=S * G // 2, **extra)
    kept, plain = run(policy_cls, 3, "adam", skip_zero_advantage=False, **fields)
    skipped, history = run(policy_cls, 3, "adam", **fields)
    torch.testing.assert_close(skipped, kept, rtol=0, atol=1e-6)
    for with_skip, without in zip(history, plain, strict=True):
        assert without["skip/zero_advantage_frac"] == 0.0
        # odd states always pay 1: at least half the groups have zero advantage
        assert with_skip["skip/zero_advantage_frac"] >= 0.5
        assert with_skip["step_loss"] == pytest.approx(without["step_loss"], abs=1e-6)


def test_a_step_whose_every_sample_is_skipped_still_moves_adam():
    """All groups uniform after a first informative step: the skipped windows still step the
    optimizer with zero gradients (Adam's momentum), exactly as without skipping."""
    calls = {"n": 0}

    def first_step_only(state, action):
        calls["n"] += 1
        return float(sum(t == 1 for t in action)) if calls["n"] <= S * G else 0.0

    results = []
    for skip in (False, True):
        calls["n"] = 0
        torch.manual_seed(0)
        policy = SequencePolicy(num_states=S, vocab_size=V, max_length=L, seed=1)
        config = GRPOConfig(group_size=G, batch_size=S * G, num_epochs_per_update=1,
                            kl_coeff=0.0, entropy_coeff=0.0, skip_zero_advantage=skip)  # fmt: skip
        trainer = GRPOTrainer(policy, FunctionReward(first_step_only),
                              lambda ps: torch.optim.Adam(ps, lr=0.05), config)  # fmt: skip
        trainer.train_step(list(range(S)))
        after_first = policy.logits.detach().clone()
        metrics = trainer.train_step(list(range(S)))
        results.append((policy.logits.detach().clone(), after_first, metrics))
    (plain, plain_first, _), (skipped, skipped_first, metrics) = results
    assert metrics["skip/zero_advantage_frac"] == 1.0 and metrics["optimizer_steps"] == 1
    assert not torch.equal(skipped, skipped_first)  # momentum moved the parameters
    torch.testing.assert_close(skipped, plain, rtol=0, atol=1e-6)


def test_no_skipping_with_a_kl_or_entropy_term():
    """A KL or entropy term gives zero-advantage samples a gradient: nothing is skipped."""
    for fields in ({"kl_coeff": 0.1}, {"entropy_coeff": 0.01}):
        torch.manual_seed(0)
        policy = SequencePolicy(num_states=S, vocab_size=V, max_length=L, seed=1)
        config = GRPOConfig(**{"group_size": G, "batch_size": S * G, "kl_coeff": 0.0,
                               "entropy_coeff": 0.0, **fields})  # fmt: skip
        metrics = GRPOTrainer(policy, FunctionReward(reward), None, config).train_step(
            list(range(S))
        )
        assert metrics["skip/zero_advantage_frac"] == 0.0


class RecordingPolicy(SequencePolicy):
    """Records the states of every gradient pass and every sampling call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scored_states: list[int] = []
        self.sampling_calls = 0

    def generate_actions(self, states, num_actions_per_state, **kwargs):
        self.sampling_calls += 1
        return super().generate_actions(states, num_actions_per_state, **kwargs)

    def get_token_log_probabilities(self, states, actions):
        if torch.is_grad_enabled():
            self.scored_states += list(states)
        return super().get_token_log_probabilities(states, actions)


def test_dynamic_sampling_trains_only_on_informative_groups():
    """Odd states always pay 1 (uninformative): the step refills with new states until its B
    groups all come from even states, and trains on nothing else."""
    torch.manual_seed(0)
    policy = RecordingPolicy(num_states=4 * S, vocab_size=V, max_length=L, seed=1)
    config = GRPOConfig(group_size=G, batch_size=S * G, num_epochs_per_update=1, kl_coeff=0.0,
                        entropy_coeff=0.0, dynamic_sampling=True, skip_zero_advantage=False,
                        dynamic_sampling_max_rounds=5)  # fmt: skip
    trainer = GRPOTrainer(policy, FunctionReward(reward), None, config)
    supply = iter([list(range(k * S, (k + 1) * S)) for k in range(1, 4)])
    metrics = trainer.train_step(list(range(S)), refill=lambda: next(supply))
    assert metrics["dynamic/rounds"] >= 2 and metrics["dynamic/capped"] == 0.0
    assert metrics["dynamic/informative_frac"] == 1.0 and metrics["reward/zero_std_frac"] == 0.0
    assert metrics["total_samples"] == S * G
    assert len(policy.scored_states) == S * G
    assert all(s % 2 == 0 for s in policy.scored_states)  # only informative groups trained


def test_the_round_cap_ends_a_step_that_cannot_fill():
    """Every group uniform: after 1 + max_rounds sampling rounds the step trains on B groups
    anyway (no stall), and says it was capped."""
    torch.manual_seed(0)
    policy = RecordingPolicy(num_states=S, vocab_size=V, max_length=L, seed=1)
    config = GRPOConfig(group_size=G, batch_size=S * G, kl_coeff=0.0, entropy_coeff=0.0,
                        dynamic_sampling=True, dynamic_sampling_max_rounds=2)  # fmt: skip
    trainer = GRPOTrainer(policy, FunctionReward(lambda s, a: 1.0), None, config)
    metrics = trainer.train_step(list(range(S)))
    assert policy.sampling_calls == 3 and metrics["dynamic/rounds"] == 3.0
    assert metrics["dynamic/capped"] == 1.0 and metrics["dynamic/informative_frac"] == 0.0
    assert metrics["total_samples"] == S * G and metrics["reward/zero_std_frac"] == 1.0


def test_dynamic_sampling_keeps_what_skipping_trains_on_without_a_baseline():
    """advantage_baseline 'none': a group of equal non-zero rewards has non-zero advantages, so
    dynamic sampling keeps it in the first round, and every sample is trained on."""
    torch.manual_seed(0)
    policy = RecordingPolicy(num_states=S, vocab_size=V, max_length=L, seed=1)
    config = GRPOConfig(group_size=G, batch_size=S * G, kl_coeff=0.0, entropy_coeff=0.0,
                        advantage_baseline="none", advantage_scale="batch",
                        dynamic_sampling=True, dynamic_sampling_max_rounds=2)  # fmt: skip
    trainer = GRPOTrainer(policy, FunctionReward(lambda s, a: 1.0 + s % 2), None, config)
    metrics = trainer.train_step(list(range(S)))
    assert policy.sampling_calls == 1 and metrics["dynamic/informative_frac"] == 1.0
    assert metrics["skip/zero_advantage_frac"] == 0.0 and metrics["loss/token_frac"] == 1.0
    assert metrics["reward/sampled_mean"] == metrics["reward/mean"] == 1.5
    assert sorted(set(policy.scored_states)) == list(range(S))


class MaskedReference:
    """A reference that scores the samples whose reward is their state's mean (advantage 0:
    a group whose rewards are all equal, and any sample at its group's mean) as the policy
    does now (detached): their k3 KL term and its gradient are exactly 0, as
    if they had none; the others as `reference`. Scores one whole step's samples at a time."""

    def __init__(self, reference, policy):
        self.reference, self.policy = reference, policy

    def get_token_log_probabilities(self, states, actions):
        ref = self.reference.get_token_log_probabilities(states, actions)
        with torch.no_grad():
            now = self.policy.get_token_log_probabilities(states, actions)
        scores = [reward(s, a) for s, a in zip(states, actions, strict=True)]
        by_state = {}
        for state, score in zip(states, scores, strict=True):
            by_state.setdefault(state, []).append(score)
        mean = {state: sum(v) / len(v) for state, v in by_state.items()}
        zero = torch.tensor([r == mean[s] for s, r in zip(states, scores, strict=True)])  # (N,)
        return ref._replace(logprobs=torch.where(zero[:, None], now.logprobs, ref.logprobs))


def test_always_skipping_drops_the_kl_term_of_zero_advantage_samples():
    """skip_zero_advantage "always" with a KL term: odd states (every reward 1, advantage 0)
    never reach the reference, and the update equals the one without skipping whose KL
    term is 0 on the zero-advantage samples alone (SGD steps, 1e-6); the full-KL update
    differs (it pulls the odd states toward the reference)."""

    class CountingReference(SequencePolicy):
        def get_token_log_probabilities(self, states, actions):
            self.scored.extend(states)
            return super().get_token_log_probabilities(states, actions)

    def train(skip, mask=False):
        torch.manual_seed(0)
        policy = SequencePolicy(num_states=S, vocab_size=V, max_length=L, seed=1)
        config = GRPOConfig(group_size=G, batch_size=S * G, kl_coeff=0.5, entropy_coeff=0.0,
                            max_grad_norm=None, skip_zero_advantage=skip)  # fmt: skip
        trainer = GRPOTrainer(policy, FunctionReward(reward),
                              lambda ps: torch.optim.SGD(ps, lr=1.0), config)  # fmt: skip
        # another seed: the policy starts away from the reference, so every state has a KL
        # gradient (a table policy's odd states would otherwise never leave it)
        reference = CountingReference(num_states=S, vocab_size=V, max_length=L, seed=2)
        reference.scored = []
        trainer.reference_policy = MaskedReference(reference, policy) if mask else reference
        history = [trainer.train_step(list(range(S))) for _ in range(3)]
        return policy.logits.detach().clone(), history, reference.scored

    always, history, scored = train("always")
    masked, _, masked_scored = train(False, mask=True)
    full, _, _ = train(True)  # a KL term: True skips nothing
    assert scored and all(s % 2 == 0 for s in scored)  # odd states never reach the reference
    assert any(s % 2 == 1 for s in masked_scored)
    assert all(h["skip/zero_advantage_frac"] >= 0.5 for h in history)
    torch.testing.assert_close(always, masked, rtol=0, atol=1e-6)
    assert (always - full).abs().max() > 1e-3  # the odd states' KL term moved the full run
    with pytest.raises(ValueError, match='skip_zero_advantage must be True, False or "always"'):
        GRPOConfig(skip_zero_advantage="sometimes")
