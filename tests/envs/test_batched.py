"""Tests for grpo.envs.batched: many episodes, generation only for unfinished ones."""

import pytest

from grpo.envs.batched import BatchedEnv
from grpo.rewards.parsers import ParseResult


class CountdownEnv:
    """Done after `length` steps; reward() = 0.5 per step taken so far (a shaped reward)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def reset(self):
        self.steps = 0
        return f"count {self.length}"

    def step(self, action):
        self.steps += 1
        return f"ack {action}", self.steps >= self.length

    def reward(self):
        return 0.5 * self.steps


def test_only_unfinished_episodes_are_stepped():
    """Episodes of lengths 1, 3, 2 drop out of `active` as they finish; texts go to the right env."""
    batched = BatchedEnv([CountdownEnv(1), CountdownEnv(3), CountdownEnv(2)])
    first = batched.reset()
    assert first == [[{"role": "user", "content": f"count {n}"}] for n in (1, 3, 2)]
    assert batched.active == [0, 1, 2]
    assert batched.step(["a0", "a1", "a2"]) == [1, 2]
    assert batched.step(["b1", "b2"]) == [1]
    assert batched.step(["c1"]) == []
    rollouts = batched.rollouts()
    assert [r.actions for r in rollouts] == [("a0",), ("a1", "b1", "c1"), ("a2", "b2")]
    assert rollouts[1].messages[-1] == {"role": "user", "content": "ack c1"}
    assert [r.rewards for r in rollouts] == [(0.5,), (0.5, 0.5, 0.5), (0.5, 0.5)]
    assert [r.total_reward for r in rollouts] == [0.5, 1.5, 1.0]


def test_parser_failure_shows_feedback_without_stepping():
    """A failed parse books its penalty, shows its obs and leaves the env's state unchanged."""

    def parser(text):
        if text.startswith("ok "):
            return ParseResult(text[3:], 0.1)
        return ParseResult(None, -1.0, "say ok")

    batched = BatchedEnv([CountdownEnv(1)])
    batched.reset()
    batched.step(["nonsense"], parser=parser)
    assert batched.envs[0].steps == 0 and batched.active == [0]
    batched.step(["ok go"], parser=parser)
    [rollout] = batched.rollouts()
    assert [m["content"] for m in rollout.messages] == [
        "count 1",
        "nonsense",
        "say ok",
        "ok go",
        "ack go",
    ]
    assert rollout.rewards == pytest.approx((-1.0, 0.6)) and not rollout.truncated


def test_truncated_and_token_ids():
    """Unfinished episodes are marked truncated; token ids are kept only when every turn has them."""
    batched = BatchedEnv([CountdownEnv(5), CountdownEnv(5)], group_ids=["g", "g"])
    batched.reset()
    batched.step(["x", "y"], token_ids=[[1, 2], None])
    rollouts = batched.rollouts()
    assert rollouts[0].action_token_ids == ((1, 2),) and rollouts[1].action_token_ids is None
    assert all(r.truncated for r in rollouts) and [r.group_id for r in rollouts] == ["g", "g"]
    assert all(r.action_truncated is None for r in rollouts)  # the agent did not say


def test_turns_cut_at_the_token_limit_are_kept_per_turn():
    """The agent's truncated flags are kept turn by turn; a turn without one leaves None."""
    batched = BatchedEnv([CountdownEnv(5), CountdownEnv(5)])
    batched.reset()
    batched.step(["x", "y"], truncated=[True, False])
    batched.step(["x", "y"], truncated=[False, None])
    first, second = batched.rollouts()
    assert first.action_truncated == (True, False) and second.action_truncated is None
    with pytest.raises(ValueError, match="1 truncated flags for 2 active"):
        batched.step(["x", "y"], truncated=[True])


def test_bad_use_is_reported():
    """Wrong numbers of texts, missing methods and stepping before reset raise clear errors."""
    with pytest.raises(TypeError, match=r"envs\[0\]"):
        BatchedEnv([object()])
    batched = BatchedEnv([CountdownEnv(2)])
    with pytest.raises(RuntimeError, match="reset"):
        _ = batched.active
    batched.reset()
    with pytest.raises(ValueError, match="2 texts for 1 active"):
        batched.step(["a", "b"])
    with pytest.raises(ValueError, match="group_ids"):
        BatchedEnv([CountdownEnv(1)], group_ids=[1, 2])


def test_one_environment_object_twice_is_refused():
    """Two episodes sharing one env object would share its state: refused, naming both."""
    env = CountdownEnv(2)
    with pytest.raises(ValueError, match=r"envs\[0\] and envs\[2\] are the same object"):
        BatchedEnv([env, CountdownEnv(2), env])
