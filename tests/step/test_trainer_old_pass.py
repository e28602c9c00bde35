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


def _policy_sampling_top_p(tiny_lm_dir):
    """A sampler that is not the scorer: top-p 0.7 draws from q = p / Z, the loss scores p."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    generation = GenerationSettings(max_new_tokens=6, seed=3, top_p=0.7)
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(generation=generation))


def test_another_sampler_skips_the_pass_with_the_same_update(tiny_lm_dir):
    """Sampler != scorer, one update per rollout: the skipped pass's stand-in (the detached
    gradient-pass log-probs) gives the update and the gap metrics the pass gives."""
    runs = {}
    for skip in (True, False):
        policy = _policy_sampling_top_p(tiny_lm_dir)
        assert not policy.sampler_is_scorer and policy.train_pass_is_old
        counts = _count_scoring_passes(policy)
        config = GRPOConfig(group_size=2, batch_size=6, num_epochs_per_update=1, kl_coeff=0.0,
                            max_grad_norm=None, skip_redundant_old_logprobs=skip)  # fmt: skip
        trainer = GRPOTrainer(policy, TokenSumReward(), config=config,
                              optimizer=lambda params: torch.optim.SGD(params, lr=1.0))  # fmt: skip
        weighed = []
        weigh = policy.rollout_importance_weights
        policy.rollout_importance_weights = lambda a, old, w=weigh, out=weighed: (
            out.append(w(a, old)) or out[-1]
        )
        trainer.train_step(PROMPTS)
        params = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        runs[skip] = (params, counts, dict(policy.rollout_metrics), weighed[-1])
    (skipped, s_counts, s_metrics, s_w), (full, f_counts, f_metrics, f_w) = runs[True], runs[False]
    assert s_counts["no_grad"] == 0 and f_counts["no_grad"] >= 1
    assert s_w is not None and float(s_w.min()) < 0.99  # truncation weighs some tokens below 1
    torch.testing.assert_close(s_w, f_w, rtol=0, atol=1e-5)
    for name in full:
        torch.testing.assert_close(skipped[name], full[name], rtol=0, atol=1e-5)
    for key in ("rollout/logprob_gap_mean", "rollout/logprob_gap_max"):
        assert s_metrics[key] == pytest.approx(f_metrics[key], abs=1e-5)


def test_a_policy_with_dropout_keeps_the_pass(tiny_lm_dir):
    """A training-mode pass that can differ from the no-grad one (dropout on) keeps the pass."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    settings = CausalLMSettings(generation=GenerationSettings(max_new_tokens=6, seed=3),
                                disable_dropout=False)  # fmt: skip
    policy = CausalLMPolicy(model, tokenizer, settings)
    assert not policy.sampler_is_scorer and not policy.train_pass_is_old
    counts = _count_scoring_passes(policy)
    config = GRPOConfig(group_size=2, batch_size=6, num_epochs_per_update=1, kl_coeff=0.0)
    GRPOTrainer(policy, TokenSumReward(), config=config).train_step(PROMPTS)
    assert counts["no_grad"] >= 1


def test_option_must_be_a_bool():
    """skip_redundant_old_logprobs is validated with its name in the message."""
    with pytest.raises(ValueError, match="skip_redundant_old_logprobs"):
        GRPOConfig(skip_redundant_old_logprobs="yes")


def _update_from_rollout(policy, sampler: str, stale: bool = False, tis_cap=None):
    """One SGD step of `policy` on its own rollout of PROMPTS; `sampler`: the batch carries no
    sampler log-probs ("none"), the sampler's scores ("scored") or its engine's recorded ones
    ("recorded"); `stale`: the weights move (seeded noise) between sampling and the update, as
    an overlapped trainer's do -> (weights after, no-grad passes, metrics, rollout, log π_old)."""
    from grpo.step.collect import sample_rollout, score_old_logprobs

    rollout = sample_rollout(policy, TokenSumReward(), PROMPTS, 2)
    if sampler == "scored":
        rollout = rollout._replace(
            sampler_logprobs=score_old_logprobs(policy, rollout).old_logprobs
        )
    elif sampler == "recorded":
        rollout = rollout._replace(sampler_logprobs=policy.sampler_logprobs(rollout.actions))
    if stale:
        generator = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
    old = score_old_logprobs(policy, rollout)  # π_old as the trainer will score it
    counts = _count_scoring_passes(policy)
    config = GRPOConfig(
        group_size=2, batch_size=6, num_epochs_per_update=1, kl_coeff=0.0, entropy_coeff=0.0
    )
    trainer = GRPOTrainer(policy, TokenSumReward(), lambda ps: torch.optim.SGD(ps, lr=1.0), config)
    trainer.objective.tis_cap = tis_cap
    metrics = trainer.train_step(PROMPTS, rollout=rollout)
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    return weights, counts["no_grad"], metrics, rollout, old


def test_a_stale_rollout_always_recomputes_pi_old_and_equals_the_fresh_update(tiny_lm_dir):
    """A rollout with sampler log-probs (overlapped sampling) runs the no-grad pass even where it
    would be skipped; sampled by these very weights, its update is the synchronous one."""
    fresh, fresh_passes, *_ = _update_from_rollout(_policy(tiny_lm_dir), "none")
    stale, stale_passes, metrics, *_ = _update_from_rollout(_policy(tiny_lm_dir), "scored")
    assert fresh_passes == 0 and stale_passes >= 1
    # the sampler is π_old, to float32 rounding: the trainer scores only the rows that train,
    # in batches of another size, and a CPU's matrix kernels may round a row differently there
    # (a gap of 4.8e-7 on an AVX2-only CPU)
    assert metrics["rollout/logprob_gap_max"] <= 1e-5
    assert metrics["importance_weight/mean"] == pytest.approx(1.0, abs=1e-5)
    for name in fresh:
        torch.testing.assert_close(stale[name], fresh[name], rtol=0, atol=1e-6)


def test_a_stale_top_p_batch_is_weighed_against_its_recorded_log_q(tiny_lm_dir):
    """Top-p sampling, weights moved after sampling: the batch carries its engine's log q, the
    trainer recomputes π_old, and the step's weights and mismatch metrics are those of
    min(π_old / q, tis_cap), by hand from π_old and log q (not capped at 1)."""
    policy = _policy_sampling_top_p(tiny_lm_dir)
    _, passes, metrics, rollout, old = _update_from_rollout(
        policy, "recorded", stale=True, tis_cap=1.1
    )
    assert passes >= 1
    mask, logq = old.completion_mask, rollout.sampler_logprobs
    logq = torch.nn.functional.pad(logq, (0, mask.shape[1] - logq.shape[1]))  # (N, T)
    log_ratio = (old.old_logprobs - logq)[mask].double()  # counted tokens
    weights, gap = log_ratio.exp().clamp(max=1.1), log_ratio.abs()
    assert float(log_ratio.exp().max()) > 1.1  # some tokens became likelier than q: capped
    assert metrics["importance_weight/mean"] == pytest.approx(weights.mean().item(), rel=1e-5)
    assert metrics["rollout/logprob_gap_mean"] == pytest.approx(gap.mean().item(), rel=1e-5)
    assert metrics["rollout/logprob_gap_max"] == pytest.approx(gap.max().item(), rel=1e-5)
    capped = (log_ratio.exp() > 1.1).double().mean().item()
    assert metrics["rollout/tis_capped_frac"] == pytest.approx(capped, rel=1e-9)
