"""GRPOTrainer: metrics, reference cadence, accumulation, clipping, skipped steps, learning."""

import itertools

import pytest
import torch
from toy_models import (
    FunctionReward,
    SequencePolicy,
    TablePolicy,
    best_arm_reward,
    token_count_reward,
)

from grpo import GRPOConfig, GRPOTrainer

SEED_KEYS = [
    "step_loss",
    "grad_norm",
    "advantage_mean",
    "advantage_std",
    "total_samples",
    # the framework API's collection_time and advantage_time, as the step's phases
    "time/step",
    "time/sampling",
    "time/rewards",
    "time/old_logprobs",
    "time/other",
]


def _params(policy):
    return [p.detach().clone() for p in policy.get_parameters().values()]


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_metrics_cover_seed_keys_and_reward_stats():
    """train_step returns the framework API's keys, per-epoch losses and reward stats as floats."""
    torch.manual_seed(0)
    counter = itertools.count()
    # state 0 always 1, state 1 always 0, state 2 all distinct: 2 of 3 groups have zero std
    reward = FunctionReward(lambda s, a: {0: 1.0, 1: 0.0}.get(s, float(next(counter))))
    config = GRPOConfig(group_size=4, batch_size=5, num_epochs_per_update=2, entropy_coeff=0.0)
    trainer = GRPOTrainer(TablePolicy(3, 3), reward, config=config)
    metrics = trainer.train_step([0, 1, 2])
    for key in SEED_KEYS + [
        f"epoch_{i}_{k}"
        for i in range(2)
        for k in ("policy_loss", "kl_penalty", "entropy_bonus", "total_loss")
    ]:
        assert isinstance(metrics[key], float), key
    assert metrics["total_samples"] == 12.0
    assert metrics["reward/zero_std_frac"] == pytest.approx(2 / 3)
    assert metrics["optimizer_steps"] == 6.0 and metrics["skipped_steps"] == 0.0  # 2 x ceil(12/5)
    assert metrics["step_loss"] == pytest.approx(
        (metrics["epoch_0_total_loss"] + metrics["epoch_1_total_loss"]) / 2, rel=1e-6
    )
    assert {"clip/low_frac", "clip/high_frac", "ratio/mean", "kl/mean"} <= set(metrics)
    assert trainer.history == [metrics] and trainer.step_count == 1 and trainer.epoch_count == 2


@pytest.mark.parametrize("freq", [0, 1, 3])
def test_reference_refreshed_exactly_every_freq_steps(freq):
    """The reference equals the policy after step k iff freq > 0 and k % freq == 0."""
    torch.manual_seed(0)
    policy = TablePolicy(3, 3)
    config = GRPOConfig(
        group_size=3,
        batch_size=9,
        kl_coeff=0.1,
        ref_update_frequency=freq,
        entropy_coeff=0.0,
        learning_rate=0.1,
    )
    trainer = GRPOTrainer(policy, best_arm_reward(3, 3), config=config)
    initial = _params(policy)
    for step in range(1, 7):
        before = _params(trainer.reference_policy)
        trainer.train_step([0, 1, 2])
        ref = _params(trainer.reference_policy)
        if freq and step % freq == 0:
            assert _equal(ref, _params(policy)) and not _equal(ref, before), step
        else:
            assert _equal(ref, before), step
    if freq == 0:
        assert _equal(_params(trainer.reference_policy), initial)


def test_a_reference_copied_every_step_is_warned_about_and_gives_zero_kl():
    """ref_update_frequency=1, μ=1, one optimizer step per rollout: π_ref = π_old, so the KL
    term is exactly 0 every step; the trainer warns once, at construction, and says why."""
    torch.manual_seed(0)
    policy = SequencePolicy(3, 4, max_length=3)
    config = GRPOConfig(group_size=4, batch_size=12, num_epochs_per_update=1, kl_coeff=0.5,
                        ref_update_frequency=1, entropy_coeff=0.0)  # fmt: skip
    with pytest.warns(UserWarning, match="ref_update_frequency=1 .* the KL term is 0") as caught:
        trainer = GRPOTrainer(policy, token_count_reward(), config=config)
    assert len(caught) == 1
    for _ in range(3):
        metrics = trainer.train_step([0, 1, 2])
        assert metrics["kl/mean"] == 0.0 and metrics["loss/kl"] == 0.0
    fixed = GRPOTrainer(policy, token_count_reward(), config=GRPOConfig(
        group_size=4, batch_size=12, num_epochs_per_update=1, kl_coeff=0.5, entropy_coeff=0.0))
    fixed.train_step([0, 1, 2])
    assert fixed.train_step([0, 1, 2])["kl/mean"] > 0  # a fixed reference does regularise


def test_reinforce_refuses_several_optimizer_steps_per_rollout():
    """REINFORCE ignores π_old: a rollout cut into two optimizer steps is rejected by name."""
    config = GRPOConfig(group_size=4, batch_size=6, num_epochs_per_update=1,
                        loss_type="reinforce", kl_coeff=0.0, entropy_coeff=0.0)  # fmt: skip
    trainer = GRPOTrainer(SequencePolicy(3, 4, max_length=3), token_count_reward(), config=config)
    with pytest.raises(ValueError, match="loss_type='reinforce' with batch_size=6"):
        trainer.train_step([0, 1, 2])  # N = 12 samples, 6 per optimizer step


def test_reference_is_frozen_and_absent_without_kl():
    """The reference is in eval mode without grads; kl_coeff=0 builds none."""
    policy = SequencePolicy(2, 3, max_length=2)
    trainer = GRPOTrainer(policy, token_count_reward(), config=GRPOConfig(kl_coeff=0.1))
    ref = trainer.reference_policy
    assert ref is not policy and not ref.training
    assert all(not p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in policy.parameters())
    assert (
        GRPOTrainer(policy, token_count_reward(), config=GRPOConfig(kl_coeff=0.0)).reference_policy
        is None
    )


def test_make_reference_is_preferred_to_deepcopy():
    """A policy's own make_reference() builds the reference."""

    class WithReference(TablePolicy):
        def make_reference(self):
            ref = TablePolicy(3, 3, seed=7)
            ref.made_by_policy = True
            return ref

    trainer = GRPOTrainer(WithReference(3, 3), best_arm_reward(3, 3))
    assert trainer.reference_policy.made_by_policy


def _one_update(batch_size, accumulation, max_grad_norm=None):
    """Parameters and metrics after one SGD(lr=1) step on a fixed rollout."""
    torch.manual_seed(0)
    policy = TablePolicy(4, 3)
    config = GRPOConfig(
        group_size=4,
        batch_size=batch_size,
        num_epochs_per_update=1,
        gradient_accumulation_steps=accumulation,
        kl_coeff=0.0,
        entropy_coeff=0.0,
        max_grad_norm=max_grad_norm,
    )
    optimizer = torch.optim.SGD([policy.logits], lr=1.0)
    start = policy.logits.detach().clone()
    metrics = GRPOTrainer(policy, best_arm_reward(4, 3), optimizer, config).train_step([0, 1, 2, 3])
    return policy.logits.detach() - start, metrics


def test_accumulation_equals_one_big_mini_batch():
    """Two accumulated mini-batches of 8 give the same update as one mini-batch of 16."""
    accumulated, m_acc = _one_update(batch_size=8, accumulation=2)
    whole, m_whole = _one_update(batch_size=16, accumulation=1)
    torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-7)
    assert m_acc["optimizer_steps"] == m_whole["optimizer_steps"] == 1.0
    _, m_split = _one_update(batch_size=8, accumulation=1)
    assert m_split["optimizer_steps"] == 2.0


def test_grad_norm_is_pre_clip_and_update_is_clipped():
    """grad_norm reports the unclipped norm; the applied SGD step has norm max_grad_norm."""
    free, m_free = _one_update(batch_size=16, accumulation=1)
    assert m_free["grad_norm"] == pytest.approx(free.norm().item(), rel=1e-5)
    clipped, m_clipped = _one_update(batch_size=16, accumulation=1, max_grad_norm=0.01)
    assert m_clipped["grad_norm"] == pytest.approx(m_free["grad_norm"], rel=1e-6)
    assert clipped.norm().item() == pytest.approx(0.01, rel=1e-4)


class PoisonedPolicy(TablePolicy):
    """Finite while sampling (eval mode), NaN log-probs while training."""

    def get_log_probabilities(self, states, actions):
        logprobs = super().get_log_probabilities(states, actions)
        return logprobs * float("nan") if self.training else logprobs


def test_non_finite_loss_skips_the_step():
    """A NaN loss applies no update, is counted in skipped_steps and warned about."""
    torch.manual_seed(0)
    policy = PoisonedPolicy(3, 3)
    start = policy.logits.detach().clone()
    config = GRPOConfig(group_size=3, batch_size=9, num_epochs_per_update=2, entropy_coeff=0.0)
    trainer = GRPOTrainer(policy, best_arm_reward(3, 3), config=config)
    with pytest.warns(RuntimeWarning, match="skipped an optimizer step"):
        metrics = trainer.train_step([0, 1, 2])
    assert torch.equal(policy.logits.detach(), start)
    assert metrics["skipped_steps"] == 2.0 and metrics["optimizer_steps"] == 0.0
    assert policy.logits.grad is None


def test_default_optimizer_is_adam_over_get_parameters():
    """optimizer=None builds Adam(lr=config.learning_rate) over get_parameters()."""
    policy = TablePolicy(3, 3)
    trainer = GRPOTrainer(policy, best_arm_reward(3, 3), config=GRPOConfig(learning_rate=0.003))
    assert isinstance(trainer.optimizer, torch.optim.Adam)
    group = trainer.optimizer.param_groups[0]
    assert group["lr"] == 0.003 and group["params"][0] is policy.logits


def test_training_raises_probability_of_best_arm():
    """Twenty GRPO steps raise π(best arm | s) on every state of a table bandit."""
    torch.manual_seed(0)
    policy = TablePolicy(4, 5)
    config = GRPOConfig(
        group_size=8, batch_size=32, kl_coeff=0.0, entropy_coeff=0.0, learning_rate=0.1
    )
    trainer = GRPOTrainer(policy, best_arm_reward(4, 5), config=config)
    best = torch.arange(4) % 5
    before = torch.softmax(policy.logits.detach(), -1)[torch.arange(4), best]
    for _ in range(20):
        trainer.train_step([0, 1, 2, 3])
    after = torch.softmax(policy.logits.detach(), -1)[torch.arange(4), best]
    assert (after > before).all() and (after > 0.9).all(), (before, after)


def test_bad_config_type_rejected():
    """config must be a GRPOConfig."""
    with pytest.raises(TypeError, match="config must be a GRPOConfig, got dict"):
        GRPOTrainer(TablePolicy(3, 3), best_arm_reward(3, 3), config={"group_size": 4})


def _scaled_run(scaler, steps=3):
    torch.manual_seed(0)
    policy = SequencePolicy(num_states=3, vocab_size=4, max_length=3, seed=2)
    config = GRPOConfig(group_size=4, batch_size=6, num_epochs_per_update=2, kl_coeff=0.05)
    trainer = GRPOTrainer(policy, token_count_reward(1), config=config, grad_scaler=scaler)
    history = [trainer.train_step([0, 1, 2]) for _ in range(steps)]
    return policy, trainer, history


def test_gradient_scaler_gives_the_unscaled_update_exactly():
    """A power-of-two loss scale, unscaled before clipping, leaves every fp32 update bit-identical."""
    plain, _, plain_history = _scaled_run(None)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    scaled, trainer, history = _scaled_run(scaler)
    assert torch.equal(plain.logits, scaled.logits)
    assert [h["grad_norm"] for h in history] == [h["grad_norm"] for h in plain_history]
    assert trainer.state_dict()["grad_scaler"]["scale"] == 2.0**12


def test_a_scaler_overflow_skips_quietly_and_lowers_the_scale():
    """An inf gradient under a scaler: no update, no warning, the scale halves (fp16 routine)."""
    torch.manual_seed(0)
    policy = TablePolicy(3, 3)
    start = policy.logits.detach().clone()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)  # x2^100 overflows fp32 grads...
    trainer = GRPOTrainer(
        policy, best_arm_reward(3, 3), config=GRPOConfig(group_size=3, batch_size=9,
        num_epochs_per_update=1, kl_coeff=0.0, entropy_coeff=0.0), grad_scaler=scaler,
    )  # fmt: skip
    policy.logits.register_hook(lambda g: g * 2.0**100)  # ...once pushed past fp32's range
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = trainer.train_step([0, 1, 2])
    assert metrics["skipped_steps"] == 1.0 and metrics["optimizer_steps"] == 0.0
    assert torch.equal(policy.logits.detach(), start)
    assert scaler.get_scale() == 2.0**99


def test_a_fused_optimizer_step_makes_a_cached_cast_of_a_weight_stale():
    """A fused AdamW writes the weights without moving their version counters; after the
    trainer's step, cast_once casts the new values (a stale cast would be the old ones)."""
    from grpo.precision import cast_once

    torch.manual_seed(0)
    policy = TablePolicy(3, 3)
    weight = next(iter(policy.get_parameters().values()))
    before = cast_once(weight, torch.bfloat16).clone()
    optimizer = torch.optim.AdamW(list(policy.get_parameters().values()), lr=0.5, fused=True)
    config = GRPOConfig(group_size=4, batch_size=12, entropy_coeff=0.0)
    trainer = GRPOTrainer(policy, best_arm_reward(3, 3), optimizer, config)
    trainer.train_step([0, 1, 2])
    assert not torch.equal(weight.detach().bfloat16(), before)  # the step moved the weight
    assert torch.equal(cast_once(weight, torch.bfloat16), weight.detach().bfloat16())
