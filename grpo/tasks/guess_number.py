"""Built-in multi-turn task: guess a secret number from "higher" / "lower" feedback.

It exercises the environment path end to end (`grpo.envs`): the environment
holds a secret integer in [low, high]; each assistant turn is a guess (the
first integer in the text); the reply is ``higher``, ``lower`` or ``correct``.
A turn without an integer gets ``Answer with a single number.`` and uses up
a guess. The episode ends when the number is found or `max_guesses` are used.

Reward (paid at the end, exact): ``1 - step_cost * (guesses - 1)`` when the
number is found, else 0; a bisecting player finds any number in [1, 16]
within 5 guesses and earns at least 0.6 with the default step cost 0.1.

Secrets are drawn from a seeded RNG (`make_secrets`), so a dataset is a list
of secrets and `episode_factory` builds the environments for `BatchedEnv`:
`group_size` episodes of the same secret form one GRPO group.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo.envs.base import EpisodeRollout, Message
from grpo.envs.batched import BatchedEnv
from grpo.envs.rollout import collect_rollouts

__all__ = [
    "GuessNumberConfig",
    "GuessNumberEnv",
    "bisection_agent",
    "episode_factory",
    "evaluate",
    "make_secrets",
]

_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class GuessNumberConfig:
    """Rules of the game."""

    low: int = 1
    """Smallest possible secret."""
    high: int = 16
    """Largest possible secret (inclusive)."""
    max_guesses: int = 6
    """Guesses allowed per episode, unreadable turns included."""
    step_cost: float = 0.1
    """Reward lost per guess after the first, when the number is found (>= 0)."""

    def __post_init__(self) -> None:
        if not isinstance(self.low, int) or not isinstance(self.high, int) or self.low > self.high:
            raise ValueError(
                f"low and high must be integers with low <= high, got {self.low}, {self.high}"
            )
        if not isinstance(self.max_guesses, int) or self.max_guesses < 1:
            raise ValueError(f"max_guesses must be a positive integer, got {self.max_guesses!r}")
        if not isinstance(self.step_cost, (int, float)) or self.step_cost < 0:
            raise ValueError(f"step_cost must be a number >= 0, got {self.step_cost!r}")

    def prompt(self) -> str:
        return (
            f"I am thinking of a number between {self.low} and {self.high}. "
            "Guess it: answer with a single number."
        )


class GuessNumberEnv:
    """One game with a fixed secret; follows the `grpo.envs.Env` protocol."""

    def __init__(self, secret: int, config: GuessNumberConfig | None = None) -> None:
        self.config = config or GuessNumberConfig()
        if not self.config.low <= secret <= self.config.high:
            raise ValueError(
                f"secret must be in [{self.config.low}, {self.config.high}], got {secret}"
            )
        self.secret = secret
        self.guesses = 0
        self.solved = False

    def reset(self) -> list[Message]:
        self.guesses = 0
        self.solved = False
        return [{"role": "user", "content": self.config.prompt()}]

    def step(self, action: str) -> tuple[str | None, bool]:
        if self.solved or self.guesses >= self.config.max_guesses:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self.guesses += 1
        out_of_guesses = self.guesses >= self.config.max_guesses
        match = _INTEGER.search(action)
        if match is None:
            return "Answer with a single number.", out_of_guesses
        guess = int(match.group())
        if guess == self.secret:
            self.solved = True
            return "correct", True
        return ("higher" if guess < self.secret else "lower"), out_of_guesses

    def reward(self) -> float:
        if not self.solved:
            return 0.0
        return 1.0 - self.config.step_cost * (self.guesses - 1)


def make_secrets(
    num_games: int, *, seed: int = 0, config: GuessNumberConfig | None = None
) -> list[int]:
    """`num_games` secrets drawn uniformly from [low, high], the same for the same seed."""
    config = config or GuessNumberConfig()
    if not isinstance(num_games, int) or num_games < 0:
        raise ValueError(f"num_games must be a non-negative integer, got {num_games!r}")
    rng = random.Random(f"guess_number/{seed}")
    return [rng.randint(config.low, config.high) for _ in range(num_games)]


def episode_factory(
    secrets: Sequence[int], config: GuessNumberConfig | None = None
) -> Callable[[int], GuessNumberEnv]:
    """``make_env(b)``: a fresh environment for game b, for `BatchedEnv.from_factory`."""
    return lambda b: GuessNumberEnv(secrets[b], config)


def bisection_agent(conversations: list[list[Message]]) -> list[str]:
    """A scripted agent that bisects using the feedback so far (a reference player)."""
    answers = []
    for messages in conversations:
        bounds = [
            int(x) for x in re.findall(r"between (-?\d+) and (-?\d+)", messages[0]["content"])[0]
        ]
        low, high = bounds
        for guess_msg, reply in zip(messages[1::2], messages[2::2], strict=False):
            guess = int(_INTEGER.search(guess_msg["content"]).group())
            if reply["content"] == "higher":
                low = guess + 1
            elif reply["content"] == "lower":
                high = guess - 1
        answers.append(str((low + high) // 2))
    return answers


def evaluate(
    agent: Callable[[list[list[Message]]], Any],
    secrets: Sequence[int],
    config: GuessNumberConfig | None = None,
) -> dict[str, float]:
    """Play one game per secret: solve rate, mean reward and mean number of guesses."""
    config = config or GuessNumberConfig()
    if not secrets:
        raise ValueError("secrets must hold at least one secret")
    batched = BatchedEnv([GuessNumberEnv(s, config) for s in secrets])
    rollouts: list[EpisodeRollout] = collect_rollouts(batched, agent, max_turns=config.max_guesses)
    solved = [env.solved for env in batched.envs]
    n = len(secrets)
    return {
        "solve_rate": sum(solved) / n,
        "reward": sum(r.total_reward for r in rollouts) / n,
        "guesses": sum(r.turns for r in rollouts) / n,
        "num_games": float(n),
    }
