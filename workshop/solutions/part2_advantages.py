"""Part 2, group advantages: the library's `group_advantages`."""

from grpo.functional.advantages import group_advantages

__all__ = ["group_advantages"]
