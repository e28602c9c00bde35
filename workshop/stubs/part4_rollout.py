"""Part 4: the rollout loop, which owns the turn taking of multi-turn episodes.

picoRL (after Ludic's interaction protocol) gives three owners:
- the environment owns the episode's state and reward (`reset`, `step`, `reward`);
- the agent owns inference: `agent(conversations) -> texts`, one text per
  conversation, or an `AgentOutput(texts, token_ids, truncated)` that also carries
  the sampled token ids of each text and whether it hit the token limit;
- the loop, which you write here, owns who plays and when to stop.

The framework gives you `BatchedEnv` (grpo/envs/batched.py), which holds N
environments and their conversations:

    batched = BatchedEnv(envs, group_ids)   # or use `envs` itself if it is one
    batched.reset()                          # start every episode
    batched.active                           # indices of the unfinished episodes
    batched.conversations(indices)           # their message lists (what the agent sees)
    batched.step(texts, token_ids=..., truncated=..., parser=...)  # one text per active episode
    batched.rollouts()                       # one EpisodeRollout per env, at the end

Check: python -m workshop.check --part 4
Library version: grpo/envs/rollout.py.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from grpo.envs.base import Env, EpisodeRollout, Message
from grpo.envs.batched import BatchedEnv
from grpo.envs.rollout import AgentOutput

__all__ = ["AgentOutput", "BatchedEnv", "collect_rollouts"]


def collect_rollouts(
    envs: BatchedEnv | Sequence[Env],
    agent: Callable[[list[list[Message]]], Any],
    *,
    max_turns: int = 8,
    group_ids: Sequence[Hashable] | None = None,
    parser: Callable[[str], Any] | None = None,
) -> list[EpisodeRollout]:
    """Play every episode to its end (or `max_turns` assistant turns); one record per env.

    envs       a BatchedEnv, or a list of N environments (then `group_ids` labels their groups)
    agent      conversations (list of message lists) -> list[str] or AgentOutput
    max_turns  the most assistant turns of any episode (an int >= 1)
    parser     optional: passed on to `BatchedEnv.step` (see part 6)
    returns    N EpisodeRollout records, in the order of `envs`

    Hints:
    - Each turn, send the agent only the unfinished episodes: an episode that is
      done must never be generated for again (it would waste a forward pass and
      corrupt its record).
    - Stop early when no episode is active.
    - Normalise the agent's answer: a plain list of texts becomes AgentOutput(list(texts)).
    - Pass the sampled ids and truncation flags on (`token_ids=output.token_ids,
      truncated=output.truncated`): training then uses exactly the tokens that were
      sampled, and can leave out of the loss the turns cut at the token limit.
    - Calling it twice on the same BatchedEnv must start fresh episodes.
    """
    raise NotImplementedError("part 4: write collect_rollouts")
