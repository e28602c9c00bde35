"""`GRPOConfig`: every hyper-parameter of `GRPOTrainer`, in one validated dataclass.

The first nine fields and their defaults are the framework API's. The rest select the
variants of `grpo.functional` (loss, aggregation, KL estimator, advantage
baseline and scale) and fix the semantics the framework API leaves open:

- `batch_size` is the number of *samples* (state-action pairs) per mini-batch,
  not states. Mini-batches are drawn from the N = B * G samples of a rollout
  after shuffling at the sample level.
- `gradient_accumulation_steps` mini-batches are summed into one optimizer
  step; with the default 1 there is one optimizer step per mini-batch, as in
  PPO. Each mini-batch's loss is weighted by its share of the samples in its
  accumulation window, so for per-sample-mean losses an accumulated step equals
  one step on the concatenated window.
- `normalize_advantages=True` divides by the *group* standard deviation (the
  GRPO paper's choice). The framework API's text describes scaling across the whole
  batch; that is `advantage_scale="batch"`.
- `ref_update_frequency` defaults to 0 (a fixed reference), not the framework API's 1:
  a reference copied every step equals π_old, and the KL term regularises nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo.functional.advantages import BASELINES, SCALES
from grpo.functional.kl import KL_ESTIMATORS
from grpo.functional.losses import AGGREGATIONS, POLICY_LOSSES

__all__ = ["GRPOConfig", "check_on_policy"]


@dataclass
class GRPOConfig:
    """Hyper-parameters of one GRPO run, and the loss variants it can take."""

    group_size: int = 4
    """G: actions sampled per state. At least 2, or no action has a competitor."""
    batch_size: int = 64
    """Samples (state-action pairs) per mini-batch during optimisation. Each mini-batch is
    backpropagated before the next is scored, so its activations bound the memory of the
    gradient pass: for one optimizer step per rollout with the least memory, set it to
    group_size and gradient_accumulation_steps to B (every mini-batch is then one group)."""
    num_epochs_per_update: int = 4
    """Passes over each collected rollout (PPO-style reuse of one batch)."""
    clip_epsilon: float = 0.2
    """Lower clip range: the ratio is clipped to [1 - clip_epsilon, 1 + clip_epsilon_high]."""
    kl_coeff: float = 0.04
    """Weight of the KL penalty to the reference policy; 0 builds no reference at all."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus; needs a policy that reports its entropy."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None leaves gradients unclipped."""
    normalize_advantages: bool = True
    """Divide advantages by a standard deviation (see `advantage_scale`)."""
    ref_update_frequency: int = 0
    """Copy the policy into the reference every this many steps; 0 = never (a fixed reference,
    as in the GRPO paper). Every step (1) makes the reference the policy that sampled the
    step, so with one optimizer step per rollout the KL term is exactly 0 (a warning says so)."""

    advantage_epsilon: float = 1e-4
    """Added to the standard deviation so that a group of equal rewards does not divide by 0."""
    advantage_baseline: str = "mean"
    """What is subtracted from each reward: a key of `grpo.functional.BASELINES`. "none" needs
    advantage_scale "batch" or "none" (a group scale would divide equal rewards by eps)."""
    advantage_scale: str | None = None
    """Key of `grpo.functional.SCALES`; None = "group" if normalize_advantages else "none".
    Under "group" a group's weight does not depend on how far apart its rewards are, so a minor
    reward that alone separates a group counts there as much as the main one elsewhere; "batch"
    keeps the reward weights as given (docs/word_problems.md, "Why answers shrink")."""
    advantage_positive_only: bool = False
    """Zero every negative advantage (learn only from better-than-baseline actions)."""
    loss_type: str = "clipped"
    """Per-token surrogate: a key of `grpo.functional.POLICY_LOSSES`."""
    aggregation: str = "sequence_mean"
    """How token losses become one number: a key of `grpo.functional.AGGREGATIONS`."""
    kl_estimator: str = "k3"
    """Estimator of KL(π_θ || π_ref): a key of `grpo.functional.KL_ESTIMATORS`."""
    clip_epsilon_high: float | None = None
    """Upper clip range (DAPO's clip-higher); None = same as clip_epsilon."""
    max_completion_length: int | None = None
    """Denominator of the "constant_length" aggregation (Dr. GRPO); required by it."""
    gradient_accumulation_steps: int = 1
    """Mini-batches whose gradients are summed into one optimizer step: the same update as
    one mini-batch of them all, to float rounding. An optimizer step's samples are cut into its
    mini-batches in sample order, so a group's samples share a mini-batch and one prompt forward."""
    learning_rate: float = 1e-4
    """Adam learning rate, used only when the trainer builds its own optimizer; a `grpo train`
    run rejects this key (its optimizer's rate is schedule.learning_rate)."""
    seed: int = 0
    """Seeds the trainer's mini-batch shuffling generator (saved in checkpoints)."""
    skip_redundant_old_logprobs: bool = True
    """Skip the no-grad pass that records log π_old when it cannot differ from the current
    log-probs: one optimizer step per rollout (num_epochs_per_update 1 and batch_size *
    gradient_accumulation_steps >= N) and a policy whose gradient pass scores as that pass
    would (`sampler_is_scorer` or `train_pass_is_old`: no dropout). π_old is then the detached
    current log-probs: ratio 1, the same gradient, one forward pass fewer; samples from another
    sampler (vLLM, top-k/top-p, another rollout precision) are weighed and their gap reported
    against those log-probs, over the samples the loss scores; entropy/rollout_mean is then not
    recorded. False always runs the pass."""
    skip_zero_advantage: bool | str = True
    """Do not score or backpropagate samples whose advantage is exactly 0 (e.g. every sample
    of a group whose rewards are all equal) when kl_coeff and entropy_coeff are 0: their loss
    and gradient are then exactly 0, and they still count in the loss's denominators, so the
    update is the same as without skipping. "always": skip them with a KL or entropy term too,
    which drops their KL and entropy terms from the loss (another objective: the KL anchor then
    acts only on the samples the policy gradient moves, and the reference scores those alone;
    DAPO drops such groups from the batch whole, Yu et al. 2025). Metric
    skip/zero_advantage_frac."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (Yu et al. 2025): drop groups none of whose advantages is
    non-zero (with the group baselines: rewards all equal) and sample new states until the
    batch holds as many informative groups as states were given (the run loop supplies the
    new states), at most dynamic_sampling_max_rounds extra rounds. Under torchrun the groups
    of every rank are decided together, so W processes keep what one process keeps."""
    dynamic_sampling_max_rounds: int = 3
    """Extra sampling rounds a step may take to fill its batch with informative groups. A step
    that hits the cap trains on what it has, filled up with uninformative groups (which
    contribute no gradient), so a run never stalls. Metrics dynamic/*."""

    def __post_init__(self) -> None:
        if self.advantage_scale is None:
            self.advantage_scale = "group" if self.normalize_advantages else "none"
        elif not self.normalize_advantages and self.advantage_scale != "none":
            raise ValueError(
                f"advantage_scale={self.advantage_scale!r} contradicts "
                "normalize_advantages=False; leave advantage_scale unset or set it to 'none'"
            )
        _check_int(self, "group_size", minimum=2)
        _check_int(self, "batch_size", minimum=1)
        _check_int(self, "num_epochs_per_update", minimum=1)
        _check_int(self, "ref_update_frequency", minimum=0)
        _check_int(self, "gradient_accumulation_steps", minimum=1)
        _check_int(self, "seed", minimum=0)
        _check_int(self, "dynamic_sampling_max_rounds", minimum=0)
        for name in ("skip_redundant_old_logprobs", "dynamic_sampling"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.skip_zero_advantage, bool) and self.skip_zero_advantage != "always":
            raise ValueError(
                f'skip_zero_advantage must be True, False or "always", got '
                f"{self.skip_zero_advantage!r}"
            )
        for name in ("clip_epsilon", "kl_coeff", "entropy_coeff", "learning_rate"):
            _check_number(self, name, minimum=0.0, inclusive=name != "learning_rate")
        _check_number(self, "advantage_epsilon", minimum=0.0, inclusive=True)
        for name in ("max_grad_norm", "clip_epsilon_high"):
            if getattr(self, name) is not None:
                _check_number(self, name, minimum=0.0, inclusive=False)
        if self.max_completion_length is not None:
            _check_int(self, "max_completion_length", minimum=1)
        _check_choice(self, "advantage_baseline", BASELINES)
        _check_choice(self, "advantage_scale", SCALES)
        _check_choice(self, "loss_type", POLICY_LOSSES)
        _check_choice(self, "aggregation", AGGREGATIONS)
        _check_choice(self, "kl_estimator", KL_ESTIMATORS)
        if self.loss_type == "reinforce" and self.num_epochs_per_update > 1:
            raise ValueError(
                f"num_epochs_per_update={self.num_epochs_per_update} with loss_type='reinforce': "
                "REINFORCE has no importance ratio, so reusing a rollout would train on "
                "off-policy samples uncorrected; allowed: num_epochs_per_update=1, or "
                "loss_type='clipped'"
            )
        if self.advantage_baseline == "none" and self.advantage_scale == "group":
            raise ValueError(
                "advantage_baseline='none' with advantage_scale='group': a group whose rewards "
                "are all equal has std 0, so each advantage is its reward divided by "
                "advantage_epsilon (1e4 times the reward at the default); allowed with "
                "advantage_baseline='none': advantage_scale='batch' or 'none'"
            )
        if self.aggregation == "constant_length" and self.max_completion_length is None:
            raise ValueError(
                "aggregation='constant_length' needs max_completion_length "
                "(the fixed denominator), got None"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> GRPOConfig:
        """Build a config from a mapping (e.g. parsed YAML); unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"GRPOConfig got unknown key(s) {', '.join(map(repr, unknown))}; "
                f"allowed keys: {', '.join(sorted(known))}"
            )
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        """Plain-type copy of every field (JSON/YAML-safe)."""
        return dataclasses.asdict(self)


def check_on_policy(config: GRPOConfig, N: int) -> None:
    """REINFORCE ignores π_old: every optimizer step of a rollout of N samples after the first
    would train on off-policy samples uncorrected, so a step of N samples is refused."""
    c = config
    if c.loss_type == "reinforce" and c.batch_size * c.gradient_accumulation_steps < N:
        raise ValueError(
            f"loss_type='reinforce' with batch_size={c.batch_size} x "
            f"gradient_accumulation_steps={c.gradient_accumulation_steps} < N={N} samples: "
            "several optimizer steps per rollout, and REINFORCE has no importance ratio to "
            "correct the later ones; allowed: batch_size * gradient_accumulation_steps >= N, "
            "or loss_type='clipped'"
        )


def _check_int(config: GRPOConfig, name: str, *, minimum: int) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_number(config: GRPOConfig, name: str, *, minimum: float, inclusive: bool) -> None:
    value = getattr(config, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value >= minimum if inclusive else value > minimum) and value < float("inf")
    if not ok:
        bound = ">=" if inclusive else ">"
        raise ValueError(f"{name} must be a finite number {bound} {minimum}, got {value!r}")


def _check_choice(config: GRPOConfig, name: str, table: Mapping[str, Any]) -> None:
    value = getattr(config, name)
    if value not in table:
        raise ValueError(f"{name} must be one of {', '.join(sorted(table))}; got {value!r}")
