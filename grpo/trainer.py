"""The framework API's import path for `GRPOTrainer`, which lives in `grpo.step.trainer`."""

from grpo.step.trainer import GRPOTrainer

__all__ = ["GRPOTrainer"]
