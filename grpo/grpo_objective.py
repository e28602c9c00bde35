"""The framework API's import path for `GRPOObjective`, which lives in `grpo.step.objective`."""

from grpo.step.objective import GRPOObjective

__all__ = ["GRPOObjective"]
