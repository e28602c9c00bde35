"""Our `policy_loss` and TRL's `GRPOTrainer._compute_loss` on identical inputs.

TRL's loss types that `grpo` also has, and what they are here:

| TRL loss_type | loss_type | aggregation | denominator |
|---|---|---|---|
| grpo | clipped | sequence_mean | per sequence |o_i|, then the mean over N |
| bnpo | clipped | token_mean | Σ_i |o_i| of the batch |
| dapo | clipped | token_mean | Σ_i |o_i| of the generation batch (= the batch here) |
| dr_grpo | clipped | constant_length | N · max_completion_length |
| cispo | cispo | token_mean | as dapo; TRL's epsilon_high is the cap 1 + our eps_high |

Both sides get the same per-token log-probs (a leaf tensor), old and reference
log-probs, advantages and completion mask. TRL's own model forward is replaced
by a function that returns those log-probs, so the rest of `_compute_loss`
(ratio, clipping, k3 KL, aggregation) is TRL's code as shipped. The loss values
and their gradients with respect to the log-probs are compared.

TRL 1.16 by default multiplies the KL term by the importance ratio
(`use_bias_correction_kl`, from DeepSeek-V3.2); `grpo` has no such weight, so
the comparison (and the benchmark) switch it off: the k3 KL of DeepSeekMath's
GRPO on both sides.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from grpo.functional.losses import policy_loss

__all__ = ["TRL_LOSS_TYPES", "LossInputs", "ours", "random_inputs", "theirs"]

TRL_LOSS_TYPES = {  # TRL loss_type -> (our loss_type, our aggregation)
    "grpo": ("clipped", "sequence_mean"),
    "bnpo": ("clipped", "token_mean"),
    "dapo": ("clipped", "token_mean"),
    "dr_grpo": ("clipped", "constant_length"),
    "cispo": ("cispo", "token_mean"),
}


class LossInputs(NamedTuple):
    logprobs: Tensor  # (N, T)
    old_logprobs: Tensor  # (N, T)
    ref_logprobs: Tensor  # (N, T)
    advantages: Tensor  # (N,)
    completion_mask: Tensor  # (N, T) bool
    max_completion_length: int


def random_inputs(N: int = 6, T: int = 7, seed: int = 0) -> LossInputs:
    """Log-probs near old ones (some ratios outside the clip range), ragged lengths."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3  # (N, T)
    logprobs = old + 0.3 * torch.randn(N, T, generator=gen, dtype=torch.float64)
    ref = old + 0.2 * torch.randn(N, T, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (N,), generator=gen)  # (N,)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (N, T)
    advantages = torch.randn(N, generator=gen, dtype=torch.float64)
    return LossInputs(logprobs.clamp(max=0), old, ref, advantages, mask, T + 3)


def ours(inputs: LossInputs, trl_loss_type: str, beta: float, eps: float, eps_high: float):
    """(loss, d loss / d logprobs) from `grpo.functional.policy_loss`."""
    loss_type, aggregation = TRL_LOSS_TYPES[trl_loss_type]
    logprobs = inputs.logprobs.clone().requires_grad_(True)
    loss, _ = policy_loss(
        logprobs,
        inputs.old_logprobs,
        inputs.advantages,
        inputs.completion_mask,
        loss_type=loss_type,
        aggregation=aggregation,
        eps_low=eps,
        eps_high=eps_high,
        ref_logprobs=inputs.ref_logprobs if beta > 0 else None,
        beta=beta,
        kl_estimator="k3",
        max_completion_length=inputs.max_completion_length,
    )
    loss.backward()
    return loss.detach(), logprobs.grad


def theirs(trainer, inputs: LossInputs, trl_loss_type: str, beta: float, eps: float, eps_high):
    """(loss, d loss / d logprobs) from TRL's `_compute_loss`, set to the same options.

    `trainer` is any TRL GRPOTrainer (see `trl_side.make_trl_trainer`); its loss
    options are overwritten here and its model forward is bypassed.
    """
    N, T = inputs.logprobs.shape
    logprobs = inputs.logprobs.clone().requires_grad_(True)
    trainer.loss_type = trl_loss_type
    trainer.beta = beta
    trainer.epsilon_low = eps
    # TRL's CISPO caps the ratio itself at epsilon_high; its clipped losses use 1 + epsilon_high
    trainer.epsilon_high = 1.0 + eps_high if trl_loss_type == "cispo" else eps_high
    trainer.max_completion_length = inputs.max_completion_length
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1
    trainer.args.use_bias_correction_kl = False  # see the module docstring
    trainer.model.train()

    def per_token_logps_and_entropies(*args, **kwargs):  # stands in for TRL's model forward
        return logprobs, torch.zeros_like(logprobs), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    mask = inputs.completion_mask.long()  # TRL masks are 0/1 integers
    batch = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": inputs.advantages,
        "old_per_token_logps": inputs.old_logprobs,
        "ref_per_token_logps": inputs.ref_logprobs,
        "num_items_in_batch": mask.sum(),
    }
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), logprobs.grad
