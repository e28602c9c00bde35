"""Tests for grpo.envs.base: the Env protocol, EpisodeRollout and observation handling."""

import dataclasses

import pytest

from grpo.envs.base import Env, EpisodeRollout, as_messages
from grpo.tasks.guess_number import GuessNumberEnv


def test_episode_rollout_record():
    """total_reward sums the per-turn rewards; turns counts actions; the record is frozen."""
    rollout = EpisodeRollout(
        messages=(
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "b"},
        ),
        rewards=(0.25, 0.5),
        actions=("a", "b"),
        group_id=3,
    )
    assert rollout.total_reward == 0.75 and rollout.turns == 2 and not rollout.truncated
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.group_id = 4


def test_episode_rollout_validates_lengths():
    """One reward and (when given) one token id list per action."""
    with pytest.raises(ValueError, match="one entry per turn"):
        EpisodeRollout(messages=(), rewards=(1.0,), actions=())
    with pytest.raises(ValueError, match="action_token_ids"):
        EpisodeRollout(messages=(), rewards=(1.0,), actions=("a",), action_token_ids=())


def test_as_messages():
    """A string is one user message, None is nothing, message lists are checked."""
    assert as_messages("hi", where="x") == [{"role": "user", "content": "hi"}]
    assert as_messages(None, where="x") == []
    system = [{"role": "system", "content": "s"}]
    assert as_messages(system, where="x") == system
    with pytest.raises(TypeError, match=r"reset\(\)\[0\]"):
        as_messages([{"role": "robot", "content": "s"}], where="reset()")


def test_env_protocol_is_structural():
    """A task environment satisfies Env without inheriting from it; a plain object does not."""
    assert isinstance(GuessNumberEnv(2), Env)
    assert not isinstance(object(), Env)
