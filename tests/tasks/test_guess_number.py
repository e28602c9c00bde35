"""Tests for grpo.tasks.guess_number: the multi-turn game through the environment path."""

import pytest

from grpo.envs.batched import BatchedEnv
from grpo.envs.rollout import collect_rollouts
from grpo.tasks.guess_number import (
    GuessNumberConfig,
    GuessNumberEnv,
    bisection_agent,
    episode_factory,
    evaluate,
    make_secrets,
)


def test_env_feedback_and_reward_by_hand():
    """Secret 11: 8 -> higher, 12 -> lower, no number -> ask again, 11 -> correct; reward 1 - 0.1 * 3."""
    env = GuessNumberEnv(11)
    assert env.reset() == [{"role": "user", "content": GuessNumberConfig().prompt()}]
    assert env.step("8") == ("higher", False)
    assert env.step("I say 12!") == ("lower", False)
    assert env.step("hmm") == ("Answer with a single number.", False)
    assert env.reward() == 0.0
    assert env.step("11") == ("correct", True)
    assert env.reward() == pytest.approx(0.7)
    with pytest.raises(RuntimeError, match="finished"):
        env.step("11")


def test_running_out_of_guesses_scores_zero():
    """After max_guesses wrong guesses the episode is done with reward 0."""
    env = GuessNumberEnv(3, GuessNumberConfig(max_guesses=2))
    env.reset()
    assert env.step("1") == ("higher", False)
    assert env.step("5") == ("lower", True)
    assert env.reward() == 0.0


def test_bisection_rollout_exact_conversation():
    """collect_rollouts with the bisecting agent on secret 11 plays 8, 12, 10, 11 and earns 0.7."""
    [rollout] = collect_rollouts([GuessNumberEnv(11)], bisection_agent, max_turns=6)
    assert rollout.actions == ("8", "12", "10", "11")
    assert [m["content"] for m in rollout.messages[2::2]] == [
        "higher",
        "lower",
        "higher",
        "correct",
    ]
    assert rollout.rewards == pytest.approx((0.0, 0.0, 0.0, 0.7))
    assert not rollout.truncated


def test_secrets_are_seeded_and_groups_share_a_secret():
    """make_secrets is deterministic; from_factory gives G copies of each secret with one group id."""
    secrets = make_secrets(4, seed=1)
    assert secrets == make_secrets(4, seed=1) and all(1 <= s <= 16 for s in secrets)
    assert make_secrets(50, seed=1) != make_secrets(50, seed=2)
    batched = BatchedEnv.from_factory(episode_factory(secrets), num_groups=4, group_size=3)
    assert [env.secret for env in batched.envs] == [s for s in secrets for _ in range(3)]
    assert batched.group_ids == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_evaluate_reference_players():
    """Bisection solves every game of [1, 16] within 5 guesses; a constant guesser rarely does."""
    secrets = list(range(1, 17))
    result = evaluate(bisection_agent, secrets)
    assert result["solve_rate"] == 1.0 and result["guesses"] <= 5 and result["reward"] >= 0.6
    constant = evaluate(lambda convs: ["1"] * len(convs), secrets)
    assert constant["solve_rate"] == 1 / 16 and constant["reward"] == 1 / 16
