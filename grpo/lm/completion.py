"""`Completion`: one sampled continuation of a prompt, the action of a causal-LM policy.

It keeps the exact token ids that were sampled, next to the text, so that
log-probabilities are always computed on the tokens the policy produced and
never on a re-tokenisation of the decoded text (which can differ: merges,
whitespace, special tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Completion"]


@dataclass(frozen=True)
class Completion:
    """A sampled completion and the prompt tokens it continues."""

    text: str
    """Decoded completion, special tokens (EOS) removed; stop strings kept."""
    completion_ids: tuple[int, ...]
    """Sampled tokens up to and including the first EOS or the end of a stop string."""
    prompt_ids: tuple[int, ...]
    """Prompt tokens exactly as fed to the model (chat template applied), no padding."""
    truncated: bool
    """True when max_new_tokens ran out before an EOS or a stop string."""
    finished_by_eos: bool
    """True when the completion ends with the tokenizer's EOS token."""
    engine_logprobs: tuple[float, ...] | None = None
    """Log-prob of each completion token under the distribution it was sampled from, when that
    is not the one the trainer scores (vLLM, or top-k / top-p truncation); else None."""

    def __post_init__(self) -> None:
        # tuples make the record hashable and immutable; accept any int sequence
        object.__setattr__(self, "completion_ids", tuple(int(t) for t in self.completion_ids))
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        if not self.prompt_ids:
            raise ValueError("prompt_ids: got an empty prompt; allowed: at least one token")
        if self.engine_logprobs is not None:
            logprobs = tuple(float(x) for x in self.engine_logprobs)
            object.__setattr__(self, "engine_logprobs", logprobs)
            if len(logprobs) != len(self.completion_ids):
                raise ValueError(
                    f"engine_logprobs: got {len(logprobs)} values for {len(self.completion_ids)} "
                    "completion tokens; allowed: one log-prob per token, or None"
                )
            if not all(map(math.isfinite, logprobs)):
                raise ValueError(f"engine_logprobs: got {logprobs}; allowed: finite numbers")

    @property
    def num_tokens(self) -> int:
        """Number of completion tokens (the EOS included when there is one)."""
        return len(self.completion_ids)

    def __str__(self) -> str:
        return self.text
