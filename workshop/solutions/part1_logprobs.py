"""Part 1, log-probs with the causal shift: the library's `completion_logprobs`."""

from grpo.functional.logprobs import completion_logprobs

__all__ = ["completion_logprobs"]
