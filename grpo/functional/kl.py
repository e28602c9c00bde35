"""Per-token KL estimators from log-probs of the sampled tokens.

Follows J. Schulman, "Approximating KL Divergence" (blog, 2020), with
x = log π(a) - log π_ref(a) for a token a sampled from the current policy π:

    k1 = x                          (= log π - log π_ref)
    k2 = x² / 2
    k3 = exp(-x) - 1 + x            (= π_ref/π - log(π_ref/π) - 1, DeepSeekMath's GRPO term)

As *values*, k1 and k3 are unbiased estimates of KL(π‖π_ref) (k3 is also
always >= 0, with lower variance); k2 is biased but close for small x.

As *loss terms* the gradient is what matters. Adding β·k(a) to the loss for
a sampled a (a held fixed, so no score-function term) gives, in expectation
over a ~ π, β·E_π[∇θ k(a)]:

    k1: E_π[∇ log π(a)] = Σ_a ∇π(a) = ∇ 1 = 0     -> no regularisation at all
    k2: E_π[x ∇ log π(a)]                = ∇ KL(π‖π_ref)
    k3: E_π[(1 - π_ref/π) ∇ log π(a)]
        = -Σ_a π_ref(a) ∇ log π(a)       = ∇ KL(π_ref‖π)

So k1 in the loss does nothing in expectation (the chess loop's "KL fix"
`(logp - ref_logp).mean()` is this form), k2 pulls towards π_ref along the
reverse KL, and k3 along the forward KL. To penalise with k1 correctly, subtract
β·k1 from the reward instead (the reward-side KL penalty of PPO-RLHF), where
it multiplies the score function. `kl_estimate` itself does not warn (it is
also used for logging); `policy_loss` warns when k1 enters the loss.

Departure: k3 is computed with `expm1` for accuracy near x = 0; no clamping
(any clamp would change the gradients above).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo.functional._checks import check_shape, check_tensor, lookup

__all__ = ["KL_ESTIMATORS", "kl_estimate"]


def _k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


def _k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_ratio = ref_logprobs - logprobs  # log(π_ref / π)
    return torch.expm1(log_ratio) - log_ratio  # π_ref/π - 1 - log(π_ref/π) >= 0


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}
"""name -> fn(logprobs, ref_logprobs) -> per-token estimate, same shape."""


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π‖π_ref) at sampled tokens: (...), (...) -> (...).

    Gradient when used directly in a loss on samples from π (see the module
    docstring): k1 -> 0 in expectation, k2 -> ∇KL(π‖π_ref), k3 -> ∇KL(π_ref‖π).
    Example: π(a) = 0.5, π_ref(a) = 0.25: k1 = ln 2 = 0.693147,
    k2 = (ln 2)²/2 = 0.240227, k3 = 0.5 - 1 + ln 2 = 0.193147.
    """
    fn = lookup(KL_ESTIMATORS, estimator, "estimator")
    check_tensor(logprobs, "logprobs")
    check_shape(ref_logprobs, "ref_logprobs", tuple(logprobs.shape), "logprobs")
    return fn(logprobs, ref_logprobs)
