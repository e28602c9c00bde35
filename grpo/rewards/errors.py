"""`RewardError`: a reward function broke the reward contract while a run was using it.

Kept apart from `combine.py` (and free of torch) so that the command line can
catch it without loading the libraries a reward needs.
"""

from __future__ import annotations

__all__ = ["RewardError"]


class RewardError(ValueError):
    """A reward function raised, or returned the wrong number of values, a non-number,
    NaN/inf, or None for a sample no other function scores; or a sample lacks a column the
    function requires. The message names the function and the sample."""
