"""Pure tensor maths of GRPO: log-probs, advantages, KL estimators, losses.

No I/O, no configuration objects, no model calls, and no imports from the
rest of `grpo`. Shapes use B prompts, G group size, N = B * G samples,
T completion tokens, V vocabulary. `docs/algorithms.md` lists every variant's
formula, denominator and source.
"""

from grpo.functional.advantages import BASELINES, SCALES, group_advantages
from grpo.functional.importance import logprob_gap, truncated_importance_weights
from grpo.functional.kl import KL_ESTIMATORS, kl_estimate
from grpo.functional.logprobs import (
    DEFAULT_CHUNK_ELEMENTS,
    completion_logprobs,
    entropy_from_logits,
    selective_log_softmax,
)
from grpo.functional.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    Clip,
    TokenLoss,
    aggregate,
    policy_loss,
)
from grpo.functional.output_layer import (
    output_layer_entropy,
    output_layer_logprobs,
    output_layer_logprobs_entropy,
)
from grpo.functional.sampling import choose_tokens, draw_indices, filter_logits

__all__ = [
    "AGGREGATIONS",
    "BASELINES",
    "Clip",
    "DEFAULT_CHUNK_ELEMENTS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "SCALES",
    "TokenLoss",
    "aggregate",
    "choose_tokens",
    "completion_logprobs",
    "draw_indices",
    "entropy_from_logits",
    "filter_logits",
    "group_advantages",
    "kl_estimate",
    "logprob_gap",
    "output_layer_entropy",
    "output_layer_logprobs",
    "output_layer_logprobs_entropy",
    "policy_loss",
    "selective_log_softmax",
    "truncated_importance_weights",
]
