"""Rollout: B states -> N = B * G sampled actions with rewards, and log π_old (the framework API).

Sampling and scoring run under `torch.no_grad()` in eval mode (the chess loop: no
dropout noise in the behaviour policy), the previous modes restored after.
State-action pairs are flattened once (sample n = i * G + j is action j of
state i) and fed to the policy and the reward model, and every model output
is checked against the shape it must have before anything downstream sees it.

The trainer calls the two stages apart (`sample_rollout`, then
`score_old_logprobs` only when π_old can differ from the first gradient
pass, and only for the samples that will be trained on);
`ExperienceCollector` is the framework API's public class doing both.

Departures from the framework API:
- A policy that implements `TokenLevelPolicy` has its per-token log-probs and
  completion mask recorded; its `ExperienceBatch.log_prob_old_groups` hold
  their masked sums.
- No reusable internal buffers: the flattened lists are locals, freed on return.
- Non-finite rewards and log-probs are rejected with the offending sample named.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from grpo.functional.advantages import informative_groups
from grpo.protocols import TokenLevelPolicy, hook
from grpo.records import ExperienceBatch, Rollout
from grpo.step.timing import NO_TIMER

__all__ = [
    "ExperienceCollector",
    "fill_informative",
    "loss_token_counts",
    "sample_rollout",
    "score_old_logprobs",
]


class ExperienceCollector:
    """Samples `group_size` actions per state and records rewards and log π_old."""

    def __init__(self, policy: Any, reward_model: Any, group_size: int) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
        self.policy = policy
        self.reward_model = reward_model
        self.group_size = group_size

    def collect_experiences(
        self, states: Sequence[Any], *, record_old_logprobs: bool = True
    ) -> ExperienceBatch:
        """Roll out and score: (B,) states -> ExperienceBatch with (B, G) groups.

        `record_old_logprobs=False`: no scoring pass; `log_prob_old_groups`,
        `old_token_logprobs` and `completion_mask` are None (π_old is then the
        detached current log-probs: on-policy).
        """
        rollout = sample_rollout(self.policy, self.reward_model, states, self.group_size)
        if record_old_logprobs:
            rollout = score_old_logprobs(self.policy, rollout)
        token_level = isinstance(self.policy, TokenLevelPolicy)
        return rollout.to_experience_batch(self.group_size, token_level)


def sample_rollout(
    policy: Any, reward_model: Any, states: Sequence[Any], G: int, timer: Any = NO_TIMER
) -> Rollout:
    """Sample G actions per state and score them: (B,) states -> Rollout of N = B * G samples.

    `timer` (a `StepTimer`) gets the time of the "sampling" and "rewards" phases."""
    if isinstance(states, (str, bytes)):
        raise TypeError(f"states must be a list of states, got a single {type(states).__name__}")
    if states is None or len(states) == 0:
        raise ValueError("states must be a non-empty list of states, got an empty one")
    states = list(states)
    B = len(states)
    with _no_grad_eval(policy, reward_model):
        with timer.phase("sampling"):
            action_groups = _check_groups(policy.generate_actions(states, G), B, G)
        flat_states = [s for s in states for _ in range(G)]  # (N,)
        flat_actions = [a for group in action_groups for a in group]  # (N,)
        timer.count_sampled(flat_actions)
        with timer.phase("rewards"):
            rewards = _check_rewards(reward_model.compute_rewards(flat_states, flat_actions), B, G)
    return Rollout(flat_states, flat_actions, rewards)


def fill_informative(
    sample: Callable[[list[Any]], Rollout],
    states: Sequence[Any],
    refill: Callable[[], Sequence[Any]],
    parallel: Any,
    advantages: Callable[[Tensor], Tensor],
    G: int,
    max_rounds: int,
) -> tuple[Rollout, dict[str, float]]:
    """Dynamic sampling (DAPO, Yu et al. 2025): the step's B groups, informative ones first.

    Every round, each rank samples its shard of the round's states (`sample(local_states)`)
    and the ranks exchange their groups, so that every rank sees the round's groups in
    global order and takes the same decisions a single process would. A group is kept
    when `informative_groups` says so for `advantages(rewards)` (the trainer's own
    estimator: the test that also decides skipping). New states from `refill()` (global,
    like `states`) are sampled until B informative groups are held or `max_rounds` extra
    rounds are done. Kept are the first B informative groups in sampling order; a batch
    still short after the cap is filled with the most recent uninformative groups (zero
    advantage: no gradient), so every step trains on B groups. Returns this process's
    shard of them and the dynamic/* metrics.

    Departure from DAPO: informative means "some advantage is non-zero", which is DAPO's
    "rewards not all equal" under the group-relative baselines.
    """
    B = len(states)
    informative: list[Rollout] = []
    spare: list[Rollout] = []
    rounds, sampled, reward_sum = 0, 0, 0.0
    batch = states
    while True:
        local = sample(parallel.shard_states(batch))
        rollout = Rollout.concat(parallel.gather_objects(local))  # every rank's, global order
        keep = informative_groups(advantages(rollout.rewards), G)  # (groups of this round,)
        for i, flag in enumerate(keep.tolist()):
            group = rollout.take(torch.arange(i * G, (i + 1) * G))
            (informative if flag else spare).append(group)
        sampled += len(keep)
        reward_sum += rollout.rewards.double().sum().item()
        if len(informative) >= B or rounds == max_rounds:
            break
        rounds += 1
        batch = list(refill())
    kept = Rollout.concat(informative[:B] + spare[::-1][: max(0, B - len(informative))])
    mine = torch.tensor(parallel.shard_states(range(kept.num_samples)), dtype=torch.long)
    metrics = {
        "dynamic/rounds": float(rounds + 1),
        "dynamic/informative_frac": min(len(informative), B) / B,
        "dynamic/sampled_zero_std_frac": len(spare) / sampled,
        "dynamic/capped": float(len(informative) < B),
        "reward/sampled_mean": reward_sum / (sampled * G),  # every group, set aside or not
    }
    return kept.take(mine), metrics


def score_old_logprobs(policy: Any, rollout: Rollout, rows: Tensor | None = None) -> Rollout:
    """The rollout with log π_old (N, T) and its completion mask, scored without gradient.

    `rows` (n,): score only these samples; the others keep log-prob 0 and an
    all-False mask (they are never trained on).
    """
    idx = torch.arange(rollout.num_samples) if rows is None else rows
    states = [rollout.states[n] for n in idx.tolist()]
    actions = [rollout.actions[n] for n in idx.tolist()]
    with _no_grad_eval(policy):
        logprobs, mask = _score(policy, states, actions)  # (n, T) each
    if rows is not None:  # scatter into (N, T): unscored rows count nothing
        full = logprobs.new_zeros((rollout.num_samples, logprobs.shape[1]))
        logprobs = full.index_copy(0, rows.to(full.device), logprobs)
        mask = torch.zeros_like(full, dtype=torch.bool).index_copy(0, rows.to(full.device), mask)
    return rollout._replace(old_logprobs=logprobs, completion_mask=mask)


def loss_token_counts(policy: Any, rollout: Rollout) -> Tensor | None:
    """(N,) positions the loss counts per sample, known before any gradient pass, or None.

    From the policy's `loss_token_counts` hook, else the recorded completion mask
    (all rows scored); 1 per action for a per-action policy (T = 1).
    """
    if not isinstance(policy, TokenLevelPolicy):
        return torch.ones(rollout.num_samples, dtype=torch.long)
    count = hook(policy, "loss_token_counts")
    if count is None:
        mask = rollout.completion_mask
        return None if mask is None else mask.sum(dim=1).long().cpu()
    counts = torch.as_tensor(count(rollout.states, rollout.actions)).long().cpu()
    if tuple(counts.shape) != (rollout.num_samples,):
        raise ValueError(
            f"loss_token_counts must return shape ({rollout.num_samples},); got {tuple(counts.shape)}"
        )
    return counts


def _score(policy: Any, states: list[Any], actions: list[Any]) -> tuple[Tensor, Tensor]:
    """log π per position (n, T) float32 and mask (n, T) bool, from either policy contract."""
    n = len(actions)
    if isinstance(policy, TokenLevelPolicy):
        out = policy.get_token_log_probabilities(states, actions)
        logprobs = out.logprobs.detach().float()  # (n, T)
        mask = out.completion_mask.detach().bool()  # (n, T)
        if logprobs.dim() != 2 or logprobs.shape[0] != n or mask.shape != logprobs.shape:
            raise ValueError(
                "get_token_log_probabilities must return logprobs and completion_mask "
                f"of shape (N, T) with N={n}; got {tuple(logprobs.shape)} and {tuple(mask.shape)}"
            )
        _check_finite(logprobs.masked_fill(~mask, 0.0).sum(-1), "get_token_log_probabilities")
        return logprobs, mask
    logprobs = torch.as_tensor(policy.get_log_probabilities(states, actions))
    if tuple(logprobs.shape) != (n,):
        raise ValueError(
            f"get_log_probabilities must return shape ({n},) for {n} state-action pairs; "
            f"got {tuple(logprobs.shape)}"
        )
    _check_finite(logprobs, "get_log_probabilities")
    logprobs = logprobs.detach().float().cpu()[:, None]  # (n, 1): the action is one "token"
    return logprobs, torch.ones_like(logprobs, dtype=torch.bool)


class _no_grad_eval:
    """no_grad with every given model in eval mode; each model's previous mode restored."""

    def __init__(self, *models: Any) -> None:
        self.models = models
        self.grad = torch.no_grad()

    def __enter__(self) -> None:
        self.modes = [_enter_eval(model) for model in self.models]
        self.grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.grad.__exit__(*exc)
        for model, was_training in zip(self.models, self.modes, strict=True):
            if was_training:
                model.train()


def _check_groups(action_groups: Any, B: int, G: int) -> list[list[Any]]:
    """generate_actions must return B lists of exactly G actions."""
    if not isinstance(action_groups, Sequence):
        raise TypeError(
            f"generate_actions must return a list of {B} lists of {G} actions, "
            f"got a {type(action_groups).__name__} (convert tensors with .tolist())"
        )
    if len(action_groups) != B:
        raise ValueError(
            f"generate_actions: expected {B} groups (one per state), got {len(action_groups)}"
        )
    groups = []
    for i, group in enumerate(action_groups):
        if not isinstance(group, Sequence) or len(group) != G:
            got = len(group) if isinstance(group, Sequence) else type(group).__name__
            raise ValueError(f"generate_actions: state {i}: expected {G} actions, got {got}")
        groups.append(list(group))
    return groups


def _check_rewards(rewards: Any, B: int, G: int) -> Tensor:
    """compute_rewards must return N = B * G finite numbers, one per pair -> (N,) float32."""
    rewards = torch.as_tensor(rewards).detach()
    if tuple(rewards.shape) != (B * G,):
        raise ValueError(
            f"compute_rewards must return shape ({B * G},) for {B} states x {G} actions; "
            f"got {tuple(rewards.shape)}"
        )
    rewards = rewards.float().cpu()
    _check_finite(rewards, "compute_rewards", group_size=G)
    return rewards


def _check_finite(values: Tensor, source: str, group_size: int | None = None) -> None:
    bad = (~torch.isfinite(values)).nonzero().flatten()
    if len(bad):
        n = int(bad[0])
        where = f" (state {n // group_size}, action {n % group_size})" if group_size else ""
        raise ValueError(
            f"{source} returned a non-finite value {values[n].item()} for sample {n}{where}; "
            f"{len(bad)} of {len(values)} values are NaN or infinite"
        )


def _enter_eval(model: Any) -> bool | None:
    """Switch to eval mode; return the previous `training` flag (None if unknown)."""
    was_training = getattr(model, "training", None)
    model.eval()
    return was_training if isinstance(was_training, bool) else None
