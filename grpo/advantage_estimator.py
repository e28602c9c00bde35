"""The framework API's import path for `AdvantageEstimator`, which lives in `grpo.step.advantages`."""

from grpo.step.advantages import AdvantageEstimator

__all__ = ["AdvantageEstimator"]
