"""Many episodes at once (picoRL's `BatchedEnv`).

`BatchedEnv` holds N environments and their conversations. Each turn the
rollout loop asks it which episodes are still running (`active`), has the
agent answer only those, and hands the answers back to `step`; finished
episodes are never generated for again. Departures from picoRL:
- no auto-reset: an episode runs once, then `rollouts()` returns the records;
- `step` can take a parser (`grpo.rewards.parsers`): when parsing fails the
  environment is not stepped, the parser's reward is booked for the turn and its
  observation (e.g. "answer between <answer> tags") is shown to the model instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from grpo.envs.base import Env, EpisodeRollout, Message, as_messages
from grpo.rewards.parsers import ParseResult

__all__ = ["BatchedEnv"]


class BatchedEnv:
    """N episodes stepped together; episodes with the same `group_ids` entry form a group."""

    def __init__(self, envs: Sequence[Env], group_ids: Sequence[Hashable] | None = None) -> None:
        self.envs = list(envs)
        if not self.envs:
            raise ValueError("envs must hold at least one environment, got none")
        for index, env in enumerate(self.envs):
            missing = [
                m for m in ("reset", "step", "reward") if not callable(getattr(env, m, None))
            ]
            if missing:
                raise TypeError(f"envs[{index}] ({type(env).__name__}) lacks {', '.join(missing)}")
        first: dict[int, int] = {}
        for index, env in enumerate(self.envs):
            seen = first.setdefault(id(env), index)
            if seen != index:  # one object would play two episodes with one state
                raise ValueError(
                    f"envs[{seen}] and envs[{index}] are the same object; each episode needs "
                    "its own environment (make_env must build a new one per call)"
                )
        if group_ids is not None and len(group_ids) != len(self.envs):
            raise ValueError(
                f"group_ids must have one entry per env, got {len(group_ids)} for {len(self.envs)}"
            )
        self.group_ids = list(group_ids) if group_ids is not None else list(range(len(self.envs)))
        self._started = False

    @classmethod
    def from_factory(
        cls, make_env: Callable[[int], Env], num_groups: int, group_size: int
    ) -> BatchedEnv:
        """`group_size` copies of task `b` = make_env(b) for each b < num_groups (state-major)."""
        if num_groups < 1 or group_size < 1:
            raise ValueError(
                f"num_groups and group_size must be >= 1, got {num_groups} and {group_size}"
            )
        envs = [make_env(b) for b in range(num_groups) for _ in range(group_size)]
        return cls(envs, [b for b in range(num_groups) for _ in range(group_size)])

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self) -> list[list[Message]]:
        """Start every episode; the first conversations, one per env."""
        self.messages = [
            as_messages(env.reset(), where=f"envs[{i}].reset()", observed=True) for i, env in enumerate(self.envs)
        ]
        for index, conversation in enumerate(self.messages):
            if not conversation:
                raise ValueError(f"envs[{index}].reset() returned no observation")
        self.done = [False] * len(self.envs)
        self.actions: list[list[str]] = [[] for _ in self.envs]
        self.rewards: list[list[float]] = [[] for _ in self.envs]
        self.token_ids: list[list[tuple[int, ...] | None]] = [[] for _ in self.envs]
        self.truncated: list[list[bool | None]] = [[] for _ in self.envs]
        self._last_reward = [float(env.reward()) for env in self.envs]
        self._started = True
        return [list(c) for c in self.messages]

    @property
    def active(self) -> list[int]:
        """Indices of the episodes still running, in order."""
        self._require_started()
        return [i for i, done in enumerate(self.done) if not done]

    def conversations(self, indices: Sequence[int]) -> list[list[Message]]:
        """Copies of the conversations of `indices` (what the agent sees)."""
        return [list(self.messages[i]) for i in indices]

    def step(
        self,
        texts: Sequence[str],
        *,
        token_ids: Sequence[Sequence[int] | None] | None = None,
        truncated: Sequence[bool | None] | None = None,
        parser: Callable[[str], ParseResult] | None = None,
    ) -> list[int]:
        """Apply one assistant text per active episode (in `active` order); the new `active`.
        `token_ids` and `truncated` (whether a text hit the sampler's token limit), when the
        agent reports them, are kept per turn."""
        indices = self.active
        if len(texts) != len(indices):
            raise ValueError(f"step got {len(texts)} texts for {len(indices)} active episodes")
        if token_ids is not None and len(token_ids) != len(indices):
            raise ValueError(
                f"step got {len(token_ids)} token_ids for {len(indices)} active episodes"
            )
        if truncated is not None and len(truncated) != len(indices):
            raise ValueError(
                f"step got {len(truncated)} truncated flags for {len(indices)} active episodes"
            )
        for k, index in enumerate(indices):
            text = texts[k]
            if not isinstance(text, str):
                raise TypeError(f"texts[{k}] must be a str, got {type(text).__name__}")
            ids = token_ids[k] if token_ids is not None else None
            ids = None if ids is None else tuple(int(t) for t in ids)
            cut = None if truncated is None or truncated[k] is None else bool(truncated[k])
            self._step_one(index, text, ids, cut, parser)
        return self.active

    def _step_one(
        self,
        index: int,
        text: str,
        ids: tuple[int, ...] | None,
        cut: bool | None,
        parser: Callable[[str], ParseResult] | None,
    ) -> None:
        self.messages[index].append({"role": "assistant", "content": text})
        self.actions[index].append(text)
        self.token_ids[index].append(ids)
        self.truncated[index].append(cut)
        bonus, action = 0.0, text
        if parser is not None:
            parsed = parser(text)
            bonus = float(parsed.reward)
            if parsed.action is None:
                # Parse failure: the env keeps its state; the model sees the parser's feedback.
                self.messages[index] += as_messages(parsed.obs, where="parser obs", observed=True)
                self.rewards[index].append(bonus)
                return
            action = parsed.action
        env = self.envs[index]
        observation, done = env.step(action)
        self.messages[index] += as_messages(observation, where=f"envs[{index}].step()", observed=True)
        total = float(env.reward())
        self.rewards[index].append(total - self._last_reward[index] + bonus)
        self._last_reward[index] = total
        self.done[index] = bool(done)

    def rollouts(self) -> list[EpisodeRollout]:
        """One record per episode; unfinished ones are marked `truncated`."""
        self._require_started()
        records = []
        for i in range(len(self.envs)):
            ids = self.token_ids[i]
            complete = bool(ids) and all(t is not None for t in ids)
            cut = self.truncated[i]
            known = bool(cut) and all(c is not None for c in cut)
            records.append(
                EpisodeRollout(
                    messages=tuple(dict(m) for m in self.messages[i]),
                    rewards=tuple(self.rewards[i]),
                    actions=tuple(self.actions[i]),
                    group_id=self.group_ids[i],
                    action_token_ids=tuple(ids) if complete else None,  # type: ignore[arg-type]
                    truncated=not self.done[i],
                    action_truncated=tuple(cut) if known else None,  # type: ignore[arg-type]
                )
            )
        return records

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("BatchedEnv.reset() must be called before stepping or reading it")
