"""The old-log-prob pass is skipped only when it cannot change the update."""

from __future__ import annotations

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo import GRPOConfig, GRPOTrainer
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings

PROMPTS = [{"prompt": "say yes"}, {"prompt": "count a b"}, {"prompt": "the answer"}]


class TokenSumReward:
    """Reward = sum of the completion's token ids mod 7 (any reward that varies will do)."""

    def compute_rewards(self, states, actions):
        return torch.tensor([float(sum(a.completion_ids) % 7) for a in actions])

    def to(self, device):
        return self

    def eval(self):
        return self

    def train(self):
        return self


def _policy(tiny_lm_dir):
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    settings = CausalLMSettings(generation=GenerationSettings(max_new_tokens=6, seed=3))
    return CausalLMPolicy(model, tokenizer, settings)


def _count_scoring_passes(policy) -> dict[str, int]:
    """Counts of the policy's scoring passes over the rollout, with and without gradient
    (a pass may run more than one forward: shared-prompt scoring runs two)."""
    counts = {"no_grad": 0, "grad": 0}
    score = policy.get_token_log_probabilities

    def counted(states, actions):
        counts["grad" if torch.is_grad_enabled() else "no_grad"] += 1
        return score(states, actions)

    policy.get_token_log_probabilities = counted
    return counts


def _one_step(tiny_lm_dir, **overrides):
    policy = _policy(tiny_lm_dir)
    counts = _count_scoring_passes(policy)
    values = dict(group_size=2, batch_size=6, num_epochs_per_update=1, kl_coeff=0.0)
    values.update(entropy_coeff=0.0, max_grad_norm=None, **overrides)
    trainer = GRPOTrainer(
        policy,
        TokenSumReward(),
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        config=GRPOConfig(**values),
    )
    metrics = trainer.train_step(PROMPTS)
    params = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    return params, counts, metrics


def test_skipping_the_old_pass_gives_the_same_update(tiny_lm_dir):
    """One SGD step (lr 1, so parameters move by the gradient) is the same with or without the pass."""
    skipped, skipped_counts, skipped_metrics = _one_step(tiny_lm_dir)
    full, full_counts, full_metrics = _one_step(tiny_lm_dir, skip_redundant_old_logprobs=False)
    assert skipped_counts["no_grad"] == 0 and full_counts["no_grad"] >= 1
    assert skipped_counts["grad"] == full_counts["grad"] == 1  # one mini-batch, one pass
    moved = max((full[k] - _policy_params(tiny_lm_dir)[k]).abs().max().item() for k in full)
    assert moved > 1e-4  # the step did something, so equality below means something
    for name in full:
        torch.testing.assert_close(skipped[name], full[name], rtol=0, atol=1e-6)
    assert skipped_metrics["ratio/mean"] == 1.0
    assert full_metrics["ratio/mean"] == pytest.approx(1.0, abs=1e-5)


def _policy_params(tiny_lm_dir):
    return dict(_policy(tiny_lm_dir).model.named_parameters())


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_epochs_per_update": 2},  # a second epoch is off-policy
        {"batch_size": 2},  # three optimizer steps on one rollout
        {"skip_redundant_old_logprobs": False},
    ],
)
def test_the_pass_runs_when_it_can_differ(tiny_lm_dir, overrides):
    """Several updates per rollout, or the option off: log π_old is recorded by a no-grad pass."""
    _, counts, _ = _one_step(tiny_lm_dir, **overrides)
    assert counts["no_grad"] >= 1


def test_the_pass_runs_for_another_sampler(tiny_lm_dir):
    """An engine that is not the scorer (vLLM) keeps the pass: its log-probs differ from ours."""
    policy = _policy(tiny_lm_dir)
    policy.rollout_engine.samples_with_scorer = False
    assert not policy.sampler_is_scorer
    counts = _count_scoring_passes(policy)
    config = GRPOConfig(group_size=2, batch_size=6, num_epochs_per_update=1, kl_coeff=0.0)
    GRPOTrainer(policy, TokenSumReward(), config=config).train_step(PROMPTS)
    assert counts["no_grad"] >= 1


def test_option_must_be_a_bool():
    """skip_redundant_old_logprobs is validated with its name in the message."""
    with pytest.raises(ValueError, match="skip_redundant_old_logprobs"):
        GRPOConfig(skip_redundant_old_logprobs="yes")


def test_a_stale_rollout_always_recomputes_pi_old_and_equals_the_fresh_update(tiny_lm_dir):
    """A rollout with sampler log-probs (overlapped sampling) runs the no-grad pass even where it
    would be skipped; sampled by these very weights, its update is the synchronous one."""
    from grpo.step.collect import sample_rollout, score_old_logprobs

    updates, passes = [], []
    for stale in (False, True):
        policy = _policy(tiny_lm_dir)
        rollout = sample_rollout(policy, TokenSumReward(), PROMPTS, 2)
        if stale:  # the sampler's own log-probs: here the same weights as the trainer's
            rollout = rollout._replace(
                sampler_logprobs=score_old_logprobs(policy, rollout).old_logprobs
            )
        counts = _count_scoring_passes(policy)
        config = GRPOConfig(
            group_size=2, batch_size=6, num_epochs_per_update=1, kl_coeff=0.0, entropy_coeff=0.0
        )
        trainer = GRPOTrainer(
            policy, TokenSumReward(), lambda ps: torch.optim.SGD(ps, lr=1.0), config
        )
        metrics = trainer.train_step(PROMPTS, rollout=rollout)
        updates.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
        passes.append(counts["no_grad"])
    assert passes[0] == 0 and passes[1] >= 1
    assert metrics["importance_weight/mean"] == 1.0  # π_old / π_sampler exactly 1
    for name in updates[0]:
        torch.testing.assert_close(updates[1][name], updates[0][name], rtol=0, atol=1e-6)
