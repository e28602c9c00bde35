"""Part 6, a reward parser: the library's `compose_parsers`."""

from grpo.rewards.parsers import compose_parsers

__all__ = ["compose_parsers"]
