"""`GRPOTrainer`: the one training loop, for any policy and reward model (the framework API).

One `train_step(states)`:
1. roll out G actions per state and score them (`grpo.step.collect`);
2. group-relative advantages (`AdvantageEstimator`); then, unless it cannot
   differ from the first gradient pass, a no-grad pass records log π_old;
3. `num_epochs_per_update` epochs over sample-shuffled mini-batches of
   `batch_size` samples; every `gradient_accumulation_steps` mini-batches the
   gradient is clipped to `max_grad_norm` and the optimizer steps;
4. every `ref_update_frequency` steps the reference policy becomes a copy of
   the policy.

Departures from the framework API:
- A step whose loss or gradient norm is not finite is skipped (gradients
  zeroed, no update), counted in `skipped_steps` and warned about.
- The reference policy comes from the policy's own `make_reference()` when it
  has one (e.g. a LoRA base with adapters off), else `copy.deepcopy`; it is
  frozen, and not built at all when `kl_coeff == 0`.
- Mini-batches are shuffled by the trainer's own generator (seeded, checkpointed).
- Under torchrun (a process group of W > 1 ranks) the step is data-parallel:
  `grpo.distributed.DataParallel` shards the states, gathers rewards and wraps
  the policy in DDP or FSDP2, so that W processes compute what one process
  would; in one process `SingleProcess` has the same methods and does nothing.
- The no-grad pass that records log π_old is skipped when it cannot differ
  from the current log-probs (`GRPOConfig.skip_redundant_old_logprobs`):
  the loss then uses the detached current log-probs, ratio 1, same gradient;
  actions from another sampler (vLLM, top-p, another precision) are weighed
  against those detached log-probs, as they would be against the pass's.
- Mixed precision (the fill-in plan): a `grad_scaler` (fp16) scales losses, unscales
  gradients before clipping; an overflow skips the step while the scale drops.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from grpo import checkpoint, distributed
from grpo.config import GRPOConfig, check_on_policy
from grpo.functional.advantages import informative
from grpo.precision import trained_and_peak_lr, warn_if_updates_stall
from grpo.protocols import hook, validate_policy_model, validate_reward_model
from grpo.records import Rollout
from grpo.step.advantages import AdvantageEstimator
from grpo.step.collect import (
    ExperienceCollector,
    fill_informative,
    loss_token_counts,
    sample_rollout,
    score_old_logprobs,
)
from grpo.step.metrics import loss_token_frac, rollout_metrics, step_summary
from grpo.step.minibatch import MiniBatch, optimizer_windows, skips_zero_advantage
from grpo.step.objective import GRPOObjective, behaviour_metrics
from grpo.step.timing import StepTimer, memory_metrics

__all__ = ["GRPOTrainer"]

# loss-dict entries averaged per epoch, reported as epoch_{i}_{name}
EPOCH_KEYS = ("policy_loss", "kl_penalty", "entropy_bonus", "total_loss")


class GRPOTrainer:
    """Trains `policy_model` with GRPO against `reward_model`."""

    def __init__(
        self,
        policy_model: Any,
        reward_model: Any,
        optimizer: torch.optim.Optimizer | Callable[[list[Tensor]], Any] | None = None,
        config: GRPOConfig | None = None,
        distributed_config: distributed.DistributedConfig | None = None,
        grad_scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        """`optimizer`: an optimizer over the policy's parameters, a factory params -> optimizer,
        or None (Adam at `config.learning_rate`). `distributed_config` applies only in a
        process group of more than one rank. `grad_scaler` (fp16 mixed precision, the fill-in plan):
        losses are scaled before backward, gradients unscaled before clipping."""
        validate_policy_model(policy_model)
        validate_reward_model(reward_model)
        config = GRPOConfig() if config is None else config
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
        self.config = config
        self.policy = policy_model
        self.reward_model = reward_model
        self.experience_collector = ExperienceCollector(
            policy_model, reward_model, config.group_size
        )
        self.advantage_estimator = AdvantageEstimator(
            normalize_advantages=config.normalize_advantages,
            advantage_epsilon=config.advantage_epsilon,
            baseline=config.advantage_baseline,
            scale=config.advantage_scale,
            positive_only=config.advantage_positive_only,
        )
        self.objective = GRPOObjective(
            clip_epsilon=config.clip_epsilon,
            kl_coeff=config.kl_coeff,
            entropy_coeff=config.entropy_coeff,
            loss_type=config.loss_type,
            aggregation=config.aggregation,
            kl_estimator=config.kl_estimator,
            clip_epsilon_high=config.clip_epsilon_high,
            max_completion_length=config.max_completion_length,
        )
        fsdp2 = getattr(distributed_config, "strategy", "") == "fsdp2"
        if distributed.world_size() > 1 and fsdp2 and isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                "optimizer: FSDP2 shards the parameters, so an optimizer built before "
                "the trainer holds stale ones; pass optimizer=None or a factory params -> optimizer"
            )
        # before the optimizer: FSDP2 replaces the parameters
        self.parallel = distributed.make_parallel(policy_model, distributed_config)
        if optimizer is None or callable(optimizer):
            params = list(policy_model.get_parameters().values())
            build = optimizer or (lambda ps: torch.optim.Adam(ps, lr=config.learning_rate))
            optimizer = build(params)
        self.optimizer = optimizer
        warn_if_updates_stall(*trained_and_peak_lr(optimizer))  # weights stored in bf16/fp16
        self.grad_scaler = grad_scaler
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step_count = 0  # completed train_step calls
        self.epoch_count = 0  # completed optimisation epochs, over all steps
        self.best_loss = math.inf  # lowest step_loss so far
        self.history: list[dict[str, float]] = []
        self.reference_policy = self._make_reference() if config.kl_coeff > 0 else None
        if config.kl_coeff > 0 and config.ref_update_frequency == 1:
            warnings.warn(
                f"ref_update_frequency=1 with kl_coeff={config.kl_coeff}: the reference is copied "
                "from the policy every step, so it is the policy that sampled the step (π_old) and"
                " the KL term is 0 until an optimizer step has changed the policy: exactly 0 with "
                "one optimizer step per rollout. Use ref_update_frequency=0 (a fixed reference) or"
                " a larger interval for the KL term to regularise.", UserWarning, stacklevel=2,
            )  # fmt: skip

    # ------------------------------------------------------------------ loop
    def train_step(
        self,
        states: Sequence[Any],
        refill: Callable[[], Sequence[Any]] | None = None,
        rollout: Rollout | None = None,
    ) -> dict[str, float]:
        """One GRPO update on `states`; returns detached scalar metrics.

        `refill()` gives more states for dynamic sampling (default: `states` again).
        `rollout`: the samples of `states`, drawn already (overlapped rollouts, one process);
        with `sampler_logprobs` (older weights) log π_old is always recomputed.
        """
        timer = StepTimer()
        if rollout is None:
            local, metrics = self._collect(states, refill, timer)  # this process's samples
        else:
            local, metrics = rollout, {}
            timer.count_sampled(rollout.actions)
        rewards = self.parallel.gather(local.rewards)  # (N,) every rank's, in global order
        check_on_policy(self.config, len(rewards))
        advantages = self.advantage_estimator.from_rewards(rewards, self.config.group_size)
        has_kl = self.config.kl_coeff > 0 and self.reference_policy is not None
        skip_zero = skips_zero_advantage(self.config, has_kl)
        counts = loss_token_counts(self.policy, local)  # (n,) None: unknown until scored
        stale = local.sampler_logprobs is not None  # π_old must be the trainer's own, now
        if counts is None or stale or not self._old_pass_redundant(len(rewards)):
            rows = self._informative_rows(advantages, local.num_samples) if skip_zero else None
            with timer.phase("old_logprobs"):
                local = score_old_logprobs(self.policy, local, rows if counts is not None else None)
            counts = loss_token_counts(self.policy, local) if counts is None else counts
        if stale:  # the gap of the older weights' sampler to π_old, as the loss weighs it
            old, mask, sampler = local.old_logprobs, local.completion_mask, local.sampler_logprobs
            metrics.update(behaviour_metrics(old, sampler, mask, self.objective.tis_cap))
        tokens = self.parallel.gather(counts)  # (N,)
        metrics.update(rollout_metrics(rewards.view(-1, self.config.group_size), advantages))
        metrics.update(loss_token_frac(advantages, tokens))
        metrics.setdefault("reward/sampled_mean", metrics["reward/mean"])  # no group set aside

        self.policy.train()
        totals: dict[str, float] = defaultdict(float)
        for epoch in range(self.config.num_epochs_per_update):
            epoch_means = self._run_epoch(local, advantages, tokens, totals, skip_zero, timer)
            metrics.update({f"epoch_{epoch}_{k}": epoch_means.get(k, 0.0) for k in EPOCH_KEYS})
            self.epoch_count += 1
        metrics.update(step_summary(totals))

        self.step_count += 1
        self._maybe_refresh_reference()
        metrics.update({**timer.metrics(self.parallel), **memory_metrics()})
        if math.isfinite(metrics["step_loss"]):
            self.best_loss = min(self.best_loss, metrics["step_loss"])
        self.history.append(metrics)
        return metrics

    def _collect(
        self, states: Sequence[Any], refill: Callable[[], Sequence[Any]] | None, timer: StepTimer
    ) -> tuple[Rollout, dict[str, float]]:
        """This process's samples of the step: one round, or dynamic sampling's rounds."""
        G = self.config.group_size
        sample = partial(sample_rollout, self.policy, self.reward_model, G=G, timer=timer)
        if not self.config.dynamic_sampling:
            return sample(self.parallel.shard_states(states)), {}
        return fill_informative(
            sample, states, refill or (lambda: states), self.parallel,
            partial(self.advantage_estimator.from_rewards, group_size=G),
            G, self.config.dynamic_sampling_max_rounds,
        )  # fmt: skip

    def _informative_rows(self, advantages: Tensor, num_local: int) -> Tensor:
        """This process's rows (local indices) whose global advantage is not 0, and row 0,
        the stand-in a rank trains on (with loss scale 0) when it holds none of a mini-batch."""
        owned, rows, _ = self.parallel.own(torch.arange(len(advantages)), num_local)
        keep = rows[informative(advantages[owned])]
        return torch.unique(torch.cat([keep, keep.new_zeros(1)]))  # sorted

    def _old_pass_redundant(self, N: int) -> bool:
        """True when log π_old would equal the first gradient pass's detached log-probs."""
        c = self.config
        one_update = (
            c.num_epochs_per_update == 1 and c.batch_size * c.gradient_accumulation_steps >= N
        )
        same = any(hook(self.policy, h) is True for h in ("sampler_is_scorer", "train_pass_is_old"))
        return c.skip_redundant_old_logprobs and one_update and same

    def _run_epoch(
        self,
        local: Rollout,
        advantages: Tensor,
        tokens: Tensor,
        totals: dict[str, float],
        skip_zero: bool,
        timer: StepTimer,
    ) -> dict[str, float]:
        """One pass over shuffled mini-batches; returns the epoch's means over the samples."""
        windows = optimizer_windows(
            local, advantages, tokens, self.config, self.generator, self.parallel, skip_zero
        )
        sums: dict[str, float] = defaultdict(float)
        for window in windows:
            finite = True
            self.optimizer.zero_grad(set_to_none=True)
            for k, mb in enumerate(window):
                with timer.phase("loss_backward"):
                    loss_dict = self._backward(mb, sync=k == len(window) - 1)
                finite = finite and bool(torch.isfinite(loss_dict["total_loss"]))
                if mb.scale:  # shares weighted by the window's size, means by the samples'
                    n = mb.samples.num_samples
                    distributed.accumulate_metrics(sums, loss_dict, n, mb.counts.num_sequences)
                    sums["scored"] += n
            with timer.phase("optimizer"):
                self._optimizer_step(self.parallel.all_true(finite), totals, bool(window))
        sums = self.parallel.sum_metrics(sums)
        N, scored = len(advantages), sums.pop("scored", 0.0)
        totals["samples"] += N
        totals["scored"] += scored
        for key, value in sums.items():
            totals[key] += value
        shares = distributed.SHARE_KEYS
        return {k: v / (N if k in shares else max(scored, 1)) for k, v in sums.items()}

    def _backward(self, mb: MiniBatch, sync: bool) -> dict[str, Any]:
        """Loss of one mini-batch (its share of its window's), backpropagated; returns the loss
        dict. Data-parallel: gradients are summed over ranks when `sync`."""

        def loss() -> dict[str, Any]:
            return self.objective.loss(self.policy, self.reference_policy, mb.samples, mb.counts)

        return self.parallel.backward(loss, mb.scale, sync, self._scale_loss)

    def _scale_loss(self, loss: Tensor) -> Tensor:
        """The loss times the gradient scaler's factor (fp16 mixed precision), else itself."""
        return loss if self.grad_scaler is None else self.grad_scaler.scale(loss)

    def _optimizer_step(
        self, loss_finite: bool, totals: dict[str, float], backward: bool = True
    ) -> None:
        """Clip, then step, unless the loss or the pre-clip gradient norm is not finite.

        A window whose every sample was skipped (`backward` False) steps with zero
        gradients, as it would have without skipping (Adam's moments still move).

        With a gradient scaler the gradients are unscaled before clipping, and a
        non-finite norm (an fp16 overflow) is the scaler's routine signal to lower
        its scale: the step is skipped and counted without a warning.
        """
        params = [p for p in self.policy.get_parameters().values() if p.requires_grad]
        if not backward:
            for p in params:
                p.grad = torch.zeros_like(p)
        max_norm = self.config.max_grad_norm
        scaler = self.grad_scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        grad_norm = distributed.scalar(
            torch.nn.utils.clip_grad_norm_(params, math.inf if max_norm is None else max_norm)
        )  # the norm *before* clipping, over every rank's gradients
        if loss_finite and math.isfinite(grad_norm):
            if scaler is None:
                self.optimizer.step()
            else:
                scaler.step(self.optimizer)  # unscaled already: steps with the true gradient
            # fused optimizers leave version counters, which cast_once reads, unmoved
            torch.autograd.graph.increment_version(params)
            totals["grad_norm_sum"] += grad_norm
            totals["optimizer_steps"] += 1
        elif scaler is not None and loss_finite:
            totals["skipped_steps"] += 1  # an overflow: the scaler lowers its scale below
        else:
            warnings.warn(
                f"step {self.step_count}: skipped an optimizer step (loss finite: "
                f"{loss_finite}, gradient norm {grad_norm}); no update applied",
                RuntimeWarning,
                stacklevel=3,
            )
            totals["skipped_steps"] += 1
        if scaler is not None:
            scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    # ----------------------------------------------------------- reference
    def _make_reference(self) -> Any:
        """A frozen copy of the policy (or the policy's own `make_reference()`)."""
        make = hook(self.policy, "make_reference")
        # the parallel copy: FSDP2 modules cannot be deep-copied
        reference = make() if callable(make) else self.parallel.copy_policy(self.policy)
        own = {id(p) for p in self.policy.get_parameters().values()}
        for p in reference.get_parameters().values():
            if id(p) not in own:  # never freeze weights the policy itself trains
                p.requires_grad_(False)
        reference.eval()
        return reference

    def _maybe_refresh_reference(self) -> None:
        freq = self.config.ref_update_frequency
        if self.reference_policy is not None and freq > 0 and self.step_count % freq == 0:
            self.reference_policy = self._make_reference()

    # ---------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this run bitwise-exactly: tensors and plain values only.

        Data-parallel: call on every rank (gathering FSDP2 shards is collective); the
        full (unsharded) state is complete on rank 0.
        """
        model_state = self.parallel.model_state
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            "policy": model_state(self.policy),
            "reference_policy": (
                None if self.reference_policy is None else model_state(self.reference_policy)
            ),
            "optimizer": self.parallel.optimizer_state(self.optimizer),
            "step_count": self.step_count,
            "epoch_count": self.epoch_count,
            "best_loss": self.best_loss,
            "history": self.history,
            "config": self.config.to_dict(),
            "rng": checkpoint.rng_state(self.generator),
            "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (on every rank, for any number of ranks)."""
        load_model_state = self.parallel.load_model_state
        load_model_state(self.policy, state["policy"])
        if state.get("reference_policy") is not None:
            if self.reference_policy is None:
                self.reference_policy = self._make_reference()
            load_model_state(self.reference_policy, state["reference_policy"])
        self.parallel.load_optimizer_state(self.optimizer, state["optimizer"])
        self.step_count = int(state["step_count"])
        self.epoch_count = int(state.get("epoch_count", 0))
        self.best_loss = float(state.get("best_loss", math.inf))
        self.history = list(state.get("history", []))
        checkpoint.set_rng_state(state["rng"], self.generator)
        if self.grad_scaler is not None and state.get("grad_scaler") is not None:
            self.grad_scaler.load_state_dict(state["grad_scaler"])

    def save_checkpoint(self, path: str, best_loss: float | None = None) -> None:
        """Atomically save `state_dict()` to one file (the framework API).

        Data-parallel: call on every rank; rank 0 writes full (unsharded) weights and
        optimizer state, which any number of processes can resume from.
        """
        if best_loss is not None:
            self.best_loss = float(best_loss)
        state = self.state_dict()
        if distributed.is_main_process():
            checkpoint.atomic_save(state, path)
        distributed.barrier()  # no rank reads or moves on before the file exists

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore a `save_checkpoint` file into this trainer; returns the raw state."""
        state = checkpoint.load(path)
        self.load_state_dict(state)
        return state
