"""Part 4, the rollout loop: the library's `collect_rollouts`."""

from grpo.envs.rollout import collect_rollouts

__all__ = ["collect_rollouts"]
