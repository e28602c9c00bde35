"""The contracts a user's models satisfy (the framework API, "Base Interfaces").

Policies and reward models are duck-typed: any object with the methods below
works, no inheritance needed. `validate_policy_model` / `validate_reward_model`
check an object up front and raise a `TypeError` that lists what is missing,
in the framework API's format.

Beyond the framework API, a policy may offer token-level log-probabilities
(`TokenLevelPolicy`); the objective then uses token-level losses and masks.
A policy that offers only `get_log_probabilities` is treated as T = 1.

Everything else the trainer and the run loop use when an object has it is
declared here too, in `PolicyHooks` and `RewardHooks`, and read through
`hook(obj, name)`: one place lists every optional member, with its meaning
(docs/custom_policy.md, "Optional hooks", shows each in use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from torch import Tensor

__all__ = [
    "PolicyModel",
    "RewardModel",
    "TokenLevelPolicy",
    "TokenLogProbs",
    "validate_policy_model",
    "validate_reward_model",
    "POLICY_HOOKS",
    "POLICY_METHODS",
    "PolicyHooks",
    "REWARD_HOOKS",
    "REWARD_METHODS",
    "RewardHooks",
    "hook",
]

POLICY_METHODS = (
    "generate_actions",
    "get_log_probabilities",
    "get_parameters",
    "train",
    "eval",
    "to",
)
REWARD_METHODS = ("compute_rewards", "to", "eval", "train")


@runtime_checkable
class PolicyModel(Protocol):
    """A policy π_θ(action | state) that can sample and score actions."""

    def generate_actions(
        self, states: list[Any], num_actions_per_state: int, **kwargs: Any
    ) -> list[list[Any]]:
        """Sample `num_actions_per_state` actions for each state: (B,) -> (B, G)."""
        ...

    def get_log_probabilities(self, states: list[Any], actions: list[Any]) -> Tensor:
        """log π_θ(action_i | state_i) for aligned lists of length N -> (N,)."""
        ...

    def get_parameters(self) -> dict[str, Tensor]:
        """The trainable parameters, by name."""
        ...

    def train(self) -> Any: ...

    def eval(self) -> Any: ...

    def to(self, device: Any) -> Any: ...


@runtime_checkable
class RewardModel(Protocol):
    """Scores state-action pairs: aligned lists of length N -> (N,) rewards."""

    def compute_rewards(self, states: list[Any], actions: list[Any]) -> Tensor: ...

    def to(self, device: Any) -> Any: ...

    def eval(self) -> Any: ...

    def train(self) -> Any: ...


class TokenLogProbs(NamedTuple):
    """Per-token log-probabilities of N sampled actions of up to T tokens."""

    logprobs: Tensor  # (N, T) float, log π(token_t | state, tokens_<t)
    completion_mask: Tensor  # (N, T) bool, True = a token the loss counts
    entropy: Tensor | None = None  # (N, T) float, entropy of π at each position


@runtime_checkable
class TokenLevelPolicy(Protocol):
    """Optional extension: a policy whose actions are token sequences."""

    def get_token_log_probabilities(
        self, states: Sequence[Any], actions: Sequence[Any]
    ) -> TokenLogProbs: ...


class PolicyHooks(Protocol):
    """Optional members of a policy. The trainer uses each one a policy has; none is required."""

    rollout_metrics: dict[str, float]
    """Statistics of the policy's last sampling and no-grad scoring ("completion/length_mean",
    ...), merged into the step's metrics by the run loop."""
    sampler_is_scorer: bool
    """True when actions are sampled from exactly the distribution `get_*log_probabilities`
    scores (same model, same numerics, no dropout): the no-grad pass recording log π_old may
    then be skipped when it cannot differ from the first gradient pass."""
    train_pass_is_old: bool
    """True when the gradient pass scores exactly as the no-grad pass recording log π_old
    would (no dropout or other training-mode difference), whoever sampled the actions: with
    one update per rollout that pass is then skipped and the importance weights against the
    sampler (`rollout_importance_weights`) use the detached current log-probs."""

    def make_reference(self) -> Any:
        """A frozen copy of the policy for the KL term (default: `copy.deepcopy`); e.g. a LoRA
        policy returns its base model with the adapters disabled."""
        ...

    def note_old_logprobs(self, actions: Sequence[Any], old_logprobs: Tensor, mask: Tensor) -> None:
        """Record statistics of log π_old (N, T) against the sampler's own log-probs (e.g. the
        gap, in `rollout_metrics`), when the gradient pass stood in for the no-grad pass."""
        ...

    def loss_token_counts(self, states: Sequence[Any], actions: Sequence[Any]) -> Tensor:
        """(N,) long: how many positions of each action the loss counts (the row sums of the
        completion mask `get_token_log_probabilities` would return), known without scoring.
        Lets the trainer fix a loss's token denominator before any forward pass."""
        ...

    def rollout_importance_weights(self, actions: Sequence[Any], old_logprobs: Tensor) -> Any:
        """(N, T) per-token weights on the policy loss for actions sampled by another engine
        (truncated importance sampling), or None for all 1; log π_old is scored with the weights
        that sampled the actions (a batch of older weights is weighed by the loss instead)."""
        ...

    def sampler_logprobs(self, actions: Sequence[Any]) -> Tensor | None:
        """(N, T') log-probs the sampler recorded for the actions' tokens (its own distribution:
        another engine, precision, top-k / top-p), or None when it recorded none. A batch
        sampled with older weights then needs no scoring pass for `Rollout.sampler_logprobs`."""
        ...

    def sampling_state(self) -> Any:
        """Where the policy's sampling randomness has got to (saved in checkpoints)."""
        ...

    def load_sampling_state(self, state: Any) -> None:
        """Restore what `sampling_state` returned."""
        ...

    def close(self) -> None:
        """Free what the policy holds beyond its model (e.g. an inference engine); called
        once when a run ends, also when it fails."""
        ...


class RewardHooks(Protocol):
    """Optional members of a reward model."""

    last_metrics: dict[str, float]
    """Statistics of the last `compute_rewards` call ("rewards/<name>/mean", ...), merged into
    the step's metrics and the evaluation's."""


POLICY_HOOKS = (
    "rollout_metrics",
    "sampler_is_scorer",
    "train_pass_is_old",
    "make_reference",
    "loss_token_counts",
    "rollout_importance_weights",
    "sampler_logprobs",
    "note_old_logprobs",
    "sampling_state",
    "load_sampling_state",
    "close",
)
REWARD_HOOKS = ("last_metrics",)


def hook(obj: object, name: str) -> Any:
    """`obj`'s optional member `name` (declared in `PolicyHooks` or `RewardHooks`), or None."""
    if name not in POLICY_HOOKS and name not in REWARD_HOOKS:
        raise AttributeError(f"{name!r} is not a declared hook; declared: {POLICY_HOOKS + REWARD_HOOKS}")
    return getattr(obj, name, None)


def _missing(obj: object, required: Sequence[str]) -> list[str]:
    return [name for name in required if not callable(getattr(obj, name, None))]


def _validate(obj: object, protocol_name: str, required: Sequence[str]) -> None:
    missing = _missing(obj, required)
    if missing:
        raise TypeError(
            f"Model {type(obj).__name__} does not implement {protocol_name} protocol.\n"
            f"Missing methods: {', '.join(missing)}\n"
            f"Required methods: {', '.join(required)}"
        )


def validate_policy_model(obj: object) -> None:
    """Raise `TypeError` naming every `PolicyModel` method `obj` lacks."""
    _validate(obj, "PolicyModel", POLICY_METHODS)


def validate_reward_model(obj: object) -> None:
    """Raise `TypeError` naming every `RewardModel` method `obj` lacks."""
    _validate(obj, "RewardModel", REWARD_METHODS)
