"""Tests for grpo.envs.rollout: the multi-turn loop owned by collect_rollouts."""

import pytest

from grpo.envs.batched import BatchedEnv
from grpo.envs.rollout import AgentOutput, collect_rollouts
from grpo.tasks.guess_number import GuessNumberConfig, GuessNumberEnv, bisection_agent


class RecordingAgent:
    """Plays a fixed guess sequence per episode and records the batch sizes it was asked for."""

    def __init__(self, plans):
        self.plans = plans
        self.batch_sizes = []

    def __call__(self, conversations):
        self.batch_sizes.append(len(conversations))
        texts = []
        for messages in conversations:
            secret_plan = self.plans[messages[0]["content"]]
            texts.append(secret_plan[(len(messages) - 1) // 2])
        return AgentOutput(texts, [[len(t)] for t in texts], [len(t) > 1 for t in texts])


def test_agent_is_asked_only_for_unfinished_episodes():
    """Episodes needing 1, 3 and 2 guesses give agent batches of 3, 2, 1; token ids and
    truncation flags are carried turn by turn."""
    envs = [GuessNumberEnv(s, GuessNumberConfig(low=s - 4, high=s + 4)) for s in (5, 9, 13)]
    plans = {
        env.config.prompt(): plan
        for env, plan in zip(envs, [["5"], ["1", "12", "9"], ["20", "13"]], strict=True)
    }
    agent = RecordingAgent(plans)
    rollouts = collect_rollouts(envs, agent, max_turns=5, group_ids=[0, 0, 1])
    assert agent.batch_sizes == [3, 2, 1]
    assert [r.actions for r in rollouts] == [("5",), ("1", "12", "9"), ("20", "13")]
    assert [r.total_reward for r in rollouts] == pytest.approx([1.0, 0.8, 0.9])
    assert rollouts[1].action_token_ids == ((1,), (2,), (1,))
    assert rollouts[1].action_truncated == (False, True, False)  # the agent's flags, per turn
    assert [r.group_id for r in rollouts] == [0, 0, 1]


def test_max_turns_truncates():
    """A turn limit stops unfinished episodes and marks them truncated with reward 0."""
    [rollout] = collect_rollouts(
        [GuessNumberEnv(16)], lambda convs: ["1"] * len(convs), max_turns=2
    )
    assert rollout.turns == 2 and rollout.truncated and rollout.total_reward == 0.0


def test_batched_env_is_accepted_and_rerun():
    """A BatchedEnv can be passed directly; a second collection starts fresh episodes."""
    batched = BatchedEnv([GuessNumberEnv(7), GuessNumberEnv(7)], group_ids=["a", "a"])
    first = collect_rollouts(batched, bisection_agent)
    second = collect_rollouts(batched, bisection_agent)
    assert first == second and first[0].actions == ("8", "4", "6", "7")


def test_bad_agents_and_arguments():
    """Agents returning the wrong number of texts or ids, and bad max_turns, raise ValueError."""
    envs = [GuessNumberEnv(3), GuessNumberEnv(4)]
    with pytest.raises(ValueError, match="1 texts for 2"):
        collect_rollouts(envs, lambda convs: ["1"])
    with pytest.raises(ValueError, match="token id lists"):
        collect_rollouts(envs, lambda convs: AgentOutput(["1", "2"], [[1]]))
    with pytest.raises(ValueError, match="max_turns"):
        collect_rollouts(envs, bisection_agent, max_turns=0)
    with pytest.raises(ValueError, match="group_ids must be None"):
        collect_rollouts(BatchedEnv(envs), bisection_agent, group_ids=[0, 1])
