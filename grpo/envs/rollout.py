"""The multi-turn loop: `collect_rollouts` (picoRL's interaction protocol).

Three owners, as in picoRL (after Ludic's InteractionProtocol):
- the loop (`collect_rollouts`) owns turn taking: who is still playing, when to stop;
- the agent owns inference (and, through an optional parser, parsing);
- the environment owns the episode's state and its reward.

An agent is any callable ``agent(conversations) -> texts`` taking a batch of
message lists and returning one assistant text per conversation; it may instead
return an `AgentOutput` that also carries the sampled token ids of each text,
which the training side then uses as they are (token-in/token-out).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from grpo.envs.base import Env, EpisodeRollout, Message
from grpo.envs.batched import BatchedEnv
from grpo.rewards.parsers import ParseResult

__all__ = ["Agent", "AgentOutput", "collect_rollouts"]


class AgentOutput(NamedTuple):
    """An agent's answers to a batch of conversations."""

    texts: list[str]  # one assistant text per conversation
    token_ids: list[list[int]] | None = None  # the sampled ids of each text, when known
    truncated: list[bool] | None = None  # each text hit the sampler's token limit, when known


@runtime_checkable
class Agent(Protocol):
    """Answers a batch of conversations, one assistant text each."""

    def __call__(self, conversations: list[list[Message]]) -> list[str] | AgentOutput: ...


def _agent_output(output: Any, expected: int) -> AgentOutput:
    if not isinstance(output, AgentOutput):
        output = AgentOutput(list(output))
    if len(output.texts) != expected:
        raise ValueError(
            f"the agent returned {len(output.texts)} texts for {expected} conversations"
        )
    if output.token_ids is not None and len(output.token_ids) != expected:
        raise ValueError(
            f"the agent returned {len(output.token_ids)} token id lists for {expected} conversations"
        )
    if output.truncated is not None and len(output.truncated) != expected:
        raise ValueError(
            f"the agent returned {len(output.truncated)} truncated flags for {expected} conversations"
        )
    return output


def collect_rollouts(
    envs: BatchedEnv | Sequence[Env],
    agent: Callable[[list[list[Message]]], Any],
    *,
    max_turns: int = 8,
    group_ids: Sequence[Hashable] | None = None,
    parser: Callable[[str], ParseResult] | None = None,
) -> list[EpisodeRollout]:
    """Play every episode to its end (or `max_turns` assistant turns); one record per env.

    Each turn only the unfinished episodes are sent to the agent. `group_ids`
    applies when `envs` is a plain sequence; a `BatchedEnv` carries its own.
    """
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
    if isinstance(envs, BatchedEnv):
        if group_ids is not None:
            raise ValueError("group_ids must be None when envs is a BatchedEnv (it has its own)")
        batched = envs
    else:
        batched = BatchedEnv(envs, group_ids)
    batched.reset()
    for _ in range(max_turns):
        active = batched.active
        if not active:
            break
        output = _agent_output(agent(batched.conversations(active)), len(active))
        batched.step(
            output.texts, token_ids=output.token_ids, truncated=output.truncated, parser=parser
        )
    return batched.rollouts()
