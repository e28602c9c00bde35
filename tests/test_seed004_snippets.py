"""Every usage snippet of the framework API, run as written with a concrete policy and reward model."""

import copy
import math

import pytest
import torch
from toy_models import TablePolicy, best_arm_reward, load_bandit_example

import grpo

bandit = load_bandit_example()


@pytest.fixture
def bandit_models():
    torch.manual_seed(0)
    setup = bandit.BanditSetup(num_train_contexts=32, num_test_contexts=16)
    reward_model, train_states, val_states = bandit.make_problem(setup)
    policy = bandit.BanditPolicy(setup.num_features, setup.num_arms)
    return policy, reward_model, train_states, val_states


def test_experience_collector_snippet():
    """Section 1.5: collect_experiences on prompts gives B groups of 8 scored actions."""
    policy_model, reward_model = TablePolicy(16, 4), best_arm_reward(16, 4)
    # --- the framework API ---
    # fmt: off
    from grpo.experience_collector import ExperienceCollector

    collector = ExperienceCollector(policy_model, reward_model, group_size=8)
    states = ["prompt1", "prompt2", "prompt3"]

    batch = collector.collect_experiences(states)
    # fmt: on
    # -----------------
    assert len(batch.action_groups) == 3 and {len(g) for g in batch.action_groups} == {8}
    assert (
        {len(g) for g in batch.reward_groups} == {len(g) for g in batch.log_prob_old_groups} == {8}
    )


def test_advantage_estimator_snippet():
    """Section 2.4: advantages are a 1-D tensor of N values, zero-mean within each group."""
    torch.manual_seed(1)
    from grpo.experience_collector import ExperienceCollector

    batch = ExperienceCollector(TablePolicy(4, 2), best_arm_reward(4, 2), 8).collect_experiences(
        [0, 1, 2, 3]
    )
    # --- the framework API ---
    # fmt: off
    from grpo.advantage_estimator import AdvantageEstimator

    adv_estimator = AdvantageEstimator(normalize_advantages=True)
    advantages = adv_estimator.compute_advantages(batch)  # 1-D torch.Tensor
    # fmt: on
    # -----------------
    assert advantages.shape == (32,)
    torch.testing.assert_close(advantages.view(4, 8).sum(1), torch.zeros(4), rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:entropy_coeff=0.01 but the policy reports no entropy")
def test_grpo_objective_snippet():
    """Section 3.4: one backward/step on total_loss lowers the same surrogate loss."""
    torch.manual_seed(2)
    from grpo.advantage_estimator import AdvantageEstimator
    from grpo.experience_collector import ExperienceCollector

    current_policy = TablePolicy(4, 3)
    reference_policy = copy.deepcopy(current_policy)
    experience_batch = ExperienceCollector(
        current_policy, best_arm_reward(4, 3), 8
    ).collect_experiences([0, 1, 2, 3])
    advantages = AdvantageEstimator().compute_advantages(experience_batch)
    optimizer = torch.optim.SGD([current_policy.logits], lr=0.1)
    # --- the framework API ---
    # fmt: off
    from grpo.grpo_objective import GRPOObjective

    objective = GRPOObjective(clip_epsilon=0.2, kl_coeff=0.04, entropy_coeff=0.01)
    loss_dict = objective.compute_loss(
        current_policy,
        reference_policy,
        experience_batch,
        advantages,
    )

    loss = loss_dict["total_loss"]
    loss.backward()
    optimizer.step()
    # fmt: on
    # -----------------
    after = objective.compute_loss(current_policy, reference_policy, experience_batch, advantages)
    assert after["total_loss"].item() < loss.item()


def test_basic_training_loop_snippet(bandit_models, tmp_path, monkeypatch, capsys):
    """Section 4.8: the basic loop trains, saves checkpoint_0.pt and prints the step loss."""
    monkeypatch.chdir(tmp_path)
    policy, reward_model, train_states, _ = bandit_models
    num_training_steps = 2

    def get_training_states():
        return train_states[:16]

    # --- the framework API ---
    # fmt: off
    from torch.optim import Adam

    from grpo import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        group_size=8,
        batch_size=64,
        num_epochs_per_update=4,
        clip_epsilon=0.2
    )

    optimizer = Adam(policy.parameters(), lr=1e-4)
    trainer = GRPOTrainer(policy, reward_model, optimizer, config)

    for step in range(num_training_steps):
        states = get_training_states()  # Your data source
        metrics = trainer.train_step(states)

        if step % 100 == 0:
            trainer.save_checkpoint(f"checkpoint_{step}.pt")
            print(f"Step {step}: Loss = {metrics['step_loss']:.4f}")
    # fmt: on
    # -----------------
    assert (tmp_path / "checkpoint_0.pt").exists()
    assert capsys.readouterr().out.startswith("Step 0: Loss = ")
    assert metrics["total_samples"] == 128.0 and metrics["optimizer_steps"] == 8.0


def test_custom_scheduler_and_validation_snippet(bandit_models, capsys):
    """Section 4.8: a scheduler steps alongside training; validation runs under no_grad."""
    policy, reward_model, train_states, val_states = bandit_models
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    trainer = grpo.GRPOTrainer(policy, reward_model, optimizer, grpo.GRPOConfig(group_size=4))
    num_training_steps = 2
    # --- the framework API ---
    # fmt: off
    # Custom learning rate scheduling
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)

    # Training with validation
    for step in range(num_training_steps):
        # Training
        metrics = trainer.train_step(train_states)
        scheduler.step()

        # Periodic validation
        if step % 50 == 0:
            with torch.no_grad():
                val_batch = trainer.experience_collector.collect_experiences(val_states)
                val_advantages = trainer.advantage_estimator.compute_advantages(val_batch)
                val_metrics = trainer.objective.compute_loss(
                    trainer.policy, trainer.reference_policy, val_batch, val_advantages
                )
            print(f"Validation loss: {val_metrics['total_loss']:.4f}")
    # fmt: on
    # -----------------
    assert capsys.readouterr().out.startswith("Validation loss: ")
    assert optimizer.param_groups[0]["lr"] < 1e-2 and math.isfinite(metrics["step_loss"])


def test_checkpoint_snippet(bandit_models, tmp_path, monkeypatch):
    """Section 4.7: save with best_loss, load into a fresh trainer, same weights and best loss."""
    monkeypatch.chdir(tmp_path)
    policy, reward_model, train_states, _ = bandit_models
    trainer = grpo.GRPOTrainer(policy, reward_model)
    current_loss = trainer.train_step(train_states[:8])["step_loss"]
    # --- the framework API ---
    # fmt: off
    # Save checkpoint
    trainer.save_checkpoint("model_checkpoint.pt", best_loss=current_loss)

    # Load checkpoint
    # (into a fresh trainer here, as after a restart)
    trainer = grpo.GRPOTrainer(bandit.BanditPolicy(8, 6), reward_model)
    trainer.load_checkpoint("model_checkpoint.pt")
    # fmt: on
    # -----------------
    assert trainer.best_loss == current_loss and trainer.step_count == 1
    for a, b in zip(policy.parameters(), trainer.policy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_model_validation_snippets(bandit_models, capsys):
    """'Model Validation': complete models construct; IncompletePolicy prints the framework API's lines."""
    your_policy, your_reward_model, _, _ = bandit_models
    # --- the framework API: automatic validation ---
    # fmt: off
    trainer = grpo.GRPOTrainer(
        policy_model=your_policy,
        reward_model=your_reward_model
    )
    # fmt: on
    assert trainer.policy is your_policy

    # --- the framework API: runtime validation ---
    # fmt: off
    class IncompletePolicy:
        def generate_actions(self, states, num_actions_per_state, **kwargs):
            return [[f"action_{i}"] for _ in states for i in range(num_actions_per_state)]

    try:
        trainer = grpo.GRPOTrainer(
            policy_model=IncompletePolicy(),
            reward_model=your_reward_model
        )
    except TypeError as e:
        print(e)
    # fmt: on
    # -----------------
    assert capsys.readouterr().out == (
        "Model IncompletePolicy does not implement PolicyModel protocol.\n"
        "Missing methods: get_log_probabilities, get_parameters, train, eval, to\n"
        "Required methods: generate_actions, get_log_probabilities, get_parameters, train, eval, to\n"
    )
