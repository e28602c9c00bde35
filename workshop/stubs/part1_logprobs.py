"""Part 1: log-probabilities of the completion tokens, with the causal shift.

A causal LM's output at position t is its prediction for the token at t+1:
`logits[:, 0]` predicts `input_ids[:, 1]`, and `logits[:, -1]` predicts a token
that is not in the input at all. GRPO needs log p(token | everything before it)
for each of the T completion tokens, so the T completion tokens at positions
P..P+T-1 are scored by the logits at positions P-1..P+T-2.

Check: python -m workshop.check --part 1
Library version: grpo/functional/logprobs.py (chunked, to save memory).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["completion_logprobs"]


def completion_logprobs(logits: Tensor, completion_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Per-token log-probs of the completion: (N, P+T, V), (N, T) -> (N, T).

    logits          (N, P+T, V)  one forward pass over prompt + completion (float)
    completion_ids  (N, T)       the last T tokens of that input (long)
    temperature     > 0          divide the logits by it first, as sampling did
    returns         (N, T)       out[n, t] = log softmax(logits[n, P-1+t] / temperature)[completion_ids[n, t]]

    Hints:
    - L = logits.shape[1] and T = completion_ids.shape[1]; the scoring logits are
      logits[:, L-T-1 : L-1], shape (N, T, V). Why not logits[:, -T:]?
    - `torch.log_softmax(x, dim=-1)` then `.gather(-1, ids.unsqueeze(-1)).squeeze(-1)`
      picks one log-prob per position.
    - Compute in fp32 (`.float()`): bf16 log-probs are too coarse for the loss.
    """
    raise NotImplementedError("part 1: write completion_logprobs")
