"""Pure tensor maths of GRPO: log-probs, advantages, KL estimators, losses.

No I/O, no configuration objects, no model calls, and no imports from the
rest of `grpo`. Shapes use B prompts, G group size, N = B * G samples,
T completion tokens, V vocabulary. `docs/algorithms.md` lists every variant's
formula, denominator and source.
"""

from grpo.functional.advantages import BASELINES, SCALES, group_advantages
from grpo.functional.credit import (
    ALGORITHMS,
    CREDIT_ASSIGNERS,
    LOSSES,
    Algorithm,
    compose,
    returns,
)
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

__all__ = [
    "AGGREGATIONS",
    "ALGORITHMS",
    "BASELINES",
    "CREDIT_ASSIGNERS",
    "Clip",
    "DEFAULT_CHUNK_ELEMENTS",
    "KL_ESTIMATORS",
    "LOSSES",
    "POLICY_LOSSES",
    "SCALES",
    "Algorithm",
    "TokenLoss",
    "aggregate",
    "completion_logprobs",
    "compose",
    "entropy_from_logits",
    "group_advantages",
    "kl_estimate",
    "policy_loss",
    "returns",
    "selective_log_softmax",
]
