"""Environments and multi-turn rollouts (picoRL): `Env`, `BatchedEnv`, `collect_rollouts`.

Assistant-token masks for the loss come from `grpo.envs.chat_mask`.
"""

from grpo.envs.base import Env, EpisodeRollout, Message
from grpo.envs.batched import BatchedEnv
from grpo.envs.chat_mask import ChatTemplateError, ChatTokens, tokenize_with_assistant_mask
from grpo.envs.rollout import Agent, AgentOutput, collect_rollouts

__all__ = [
    "Agent",
    "AgentOutput",
    "BatchedEnv",
    "ChatTemplateError",
    "ChatTokens",
    "Env",
    "EpisodeRollout",
    "Message",
    "collect_rollouts",
    "tokenize_with_assistant_mask",
]
