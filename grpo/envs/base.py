"""The environment contract for multi-turn rollouts (picoRL, "Environment API").

An environment owns the state of one episode and has three methods:

- ``reset() -> observation``: start an episode; the first observation is a string
  (shown as a user message) or a list of chat messages (e.g. a system prompt and
  a question);
- ``step(action) -> (observation, done)``: apply the agent's action (its text);
  the observation is a string, a list of messages or None (nothing to show);
- ``reward() -> float``: the episode's reward so far.

Rewards are kept apart from `step` (picoRL's choice, for clarity). The
rollout loop calls `reward()` after every step and records the increments, so
an environment may shape rewards turn by turn or pay only at the end; the
increments always sum to the final `reward()`.

`EpisodeRollout` is picoRL's record of one finished episode, with two
additions: `action_token_ids` (the sampled token ids of each assistant turn,
when the agent reports them, for token-in/token-out training) and `truncated`
(the turn limit ended the episode, not the environment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Env", "EpisodeRollout", "Message", "as_messages"]

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}

ROLES = ("system", "user", "assistant", "tool")


@runtime_checkable
class Env(Protocol):
    """One episode's state; see the module docstring for the contract."""

    def reset(self) -> str | list[Message]: ...

    def step(self, action: str) -> tuple[str | list[Message] | None, bool]: ...

    def reward(self) -> float: ...


@dataclass(frozen=True)
class EpisodeRollout:
    """A finished episode: the whole conversation and what each turn earned."""

    messages: tuple[Message, ...]
    """The conversation, starting with the first observation, assistant turns included."""
    rewards: tuple[float, ...]
    """Reward earned by each assistant turn (increments of `Env.reward()`)."""
    actions: tuple[str, ...]
    """The assistant texts, one per turn, in order."""
    group_id: str | int | None = None
    """Episodes with the same id form one GRPO group (same task, different samples)."""
    action_token_ids: tuple[tuple[int, ...], ...] | None = None
    """Sampled token ids of each assistant turn, when the agent reported them."""
    truncated: bool = field(default=False)
    """True when the episode hit the turn limit before the environment said done."""
    action_truncated: tuple[bool, ...] | None = None
    """Whether each assistant turn hit the sampler's token limit before its EOS, when the
    agent reported it (`policy.settings.mask_truncated_completions` masks such turns)."""

    def __post_init__(self) -> None:
        if len(self.rewards) != len(self.actions):
            raise ValueError(
                f"rewards and actions must have one entry per turn, got "
                f"{len(self.rewards)} rewards and {len(self.actions)} actions"
            )
        if self.action_token_ids is not None and len(self.action_token_ids) != len(self.actions):
            raise ValueError(
                f"action_token_ids must have one entry per turn, got "
                f"{len(self.action_token_ids)} for {len(self.actions)} actions"
            )
        if self.action_truncated is not None and len(self.action_truncated) != len(self.actions):
            raise ValueError(
                f"action_truncated must have one entry per turn, got "
                f"{len(self.action_truncated)} for {len(self.actions)} actions"
            )
        agent_turns = sum(m.get("role") == "assistant" for m in self.messages)
        if agent_turns != len(self.actions):
            raise ValueError(
                f"messages hold {agent_turns} assistant messages for {len(self.actions)} actions; "
                "every assistant message is an agent's turn"
            )

    @property
    def total_reward(self) -> float:
        """The episode's return: the sum of the per-turn rewards."""
        return float(sum(self.rewards))

    @property
    def turns(self) -> int:
        return len(self.actions)


def as_messages(
    observation: str | Sequence[Message] | None, *, where: str, observed: bool = False
) -> list[Message]:
    """An observation as a list of chat messages (a string becomes one user message).

    `observed`: the messages come from an environment or a parser, which may not speak as
    the assistant: every assistant message of an episode is an agent's turn, the tokens the
    loss counts (put a worked example in a system or user message instead)."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    messages = list(observation)
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise TypeError(
                f"{where}[{index}] must be a {{'role', 'content'}} dict with role in {ROLES} "
                f"and str content, got {message!r}"
            )
        if observed and message["role"] == "assistant":
            raise ValueError(
                f"{where}[{index}] is an assistant message: an environment's observations may "
                "hold system, user and tool messages only, since every assistant message of an "
                "episode is scored as the agent's turn (put examples in a system or user message)"
            )
    return messages
