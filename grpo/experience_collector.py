"""The framework API's import path for `ExperienceCollector`, which lives in `grpo.step.collect`."""

from grpo.step.collect import ExperienceCollector

__all__ = ["ExperienceCollector"]
