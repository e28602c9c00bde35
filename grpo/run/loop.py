"""`TrainingLoop`: a whole run of `GRPOTrainer` steps, resumable to the bit.

`GRPOTrainer.train_step` is one update on a batch of states. A run needs the
same few things around it whatever the policy is: an optimizer with a
learning-rate schedule, a seeded source of state batches, held-out evaluation
at the start, every k steps and at the end, one sink for metrics, and a state
that a checkpoint can hold so that a resumed run ends exactly where an
uninterrupted one would (`state_dict` / `load_state_dict`).

Choices:
- The schedule advances once per GRPO step (one generation batch), so
  `warmup_steps` and `num_steps` count generation batches, not optimizer
  steps (one GRPO step may hold several optimizer steps).
- A step's metrics are the trainer's, then `policy.rollout_metrics` and
  `reward.last_metrics` where those objects keep them, then the loop's own:
  "reward/start", "reward/change" (now minus the first step's),
  "loss/kl_share" = |KL term| / (|policy term| + |KL term|) (the chess loop's "KL
  penalty ratio") and "lr" (the rate the step ran at).
- An evaluation record holds flat "eval/..." numbers and "eval/samples", a
  list of dicts (prompt, completion, reward): the one non-scalar entry, which
  scalar sinks skip. The sinks also get "time/eval", its wall time, which
  `evaluations` (and so checkpoints and summaries) leave out: a wall time is
  never the same twice, and a summary compares runs.
- Evaluations leave training's randomness as they found it (`randomness_kept`):
  a run samples and trains the same with evaluations or without them.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo import distributed
from grpo.protocols import hook
from grpo.run.overlap import check_overlap, overlapped_step
from grpo.run.overlap_process import ROLLOUT_WORKERS, check_rollout_worker
from grpo.step.trainer import GRPOTrainer

__all__ = [
    "SCHEDULERS", "ScheduleConfig", "StateSampler", "TrainingLoop", "make_optimizer", "randomness_kept",
]

# our schedule names -> transformers.get_scheduler names (all take a warm-up)
SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}

Evaluator = Callable[[], tuple[dict[str, float], list[dict[str, Any]]]]


def check_int(owner: str, name: str, value: Any, minimum: int = 1) -> None:
    """Raise a ValueError naming `owner.name` unless `value` is an int >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name}: got {value!r}; allowed: an integer >= {minimum}")


def _check_number(owner: str, name: str, value: Any, *, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{owner}.{name}: got {value!r}; allowed: a finite number {bound}")


@dataclass
class ScheduleConfig:
    """Optimizer and learning-rate schedule."""

    num_steps: int = 100
    """GRPO steps (generation batches of B prompts x G completions)."""
    learning_rate: float = 1e-6
    """Peak AdamW learning rate; 1e-6 is a small rate for full fine-tuning of a pretrained
    model (the `chess` preset's)."""
    lr_scheduler: str = "constant"
    """Shape after warm-up: constant, linear (decay to 0) or cosine (decay to 0)."""
    warmup_steps: int = 0
    """GRPO steps of linear warm-up from 0 to learning_rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)."""

    def __post_init__(self) -> None:
        check_int("schedule", "num_steps", self.num_steps)
        check_int("schedule", "warmup_steps", self.warmup_steps, minimum=0)
        _check_number("schedule", "learning_rate", self.learning_rate, positive=True)
        _check_number("schedule", "weight_decay", self.weight_decay, positive=False)
        if self.lr_scheduler not in SCHEDULERS:
            raise ValueError(
                f"schedule.lr_scheduler: got {self.lr_scheduler!r}; "
                f"allowed: {', '.join(SCHEDULERS)}"
            )
        betas = tuple(self.adam_betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ValueError(
                f"schedule.adam_betas: got {self.adam_betas!r}; allowed: two numbers in [0, 1)"
            )
        self.adam_betas = (float(betas[0]), float(betas[1]))


def make_optimizer(schedule: ScheduleConfig) -> Callable[[list[torch.Tensor]], Any]:
    """A factory params -> AdamW at the schedule's peak rate (GRPOTrainer calls it)."""

    def build(params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            params,
            lr=schedule.learning_rate,
            betas=schedule.adam_betas,
            weight_decay=schedule.weight_decay,
        )

    return build


class StateSampler:
    """Endless batches of B rows, reshuffled each pass by its own seeded generator."""

    def __init__(self, rows: Sequence[Any], batch_size: int, *, seed: int = 0) -> None:
        if len(rows) == 0:
            raise ValueError("rows is empty; the sampler needs at least one state")
        check_int("sampler", "batch_size", batch_size)
        self.rows = list(rows)
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self._order: list[int] = []

    def __iter__(self) -> Iterator[list[Any]]:
        return self

    def __next__(self) -> list[Any]:
        """The next B rows; a pass that runs out continues into a fresh shuffle."""
        batch = []
        while len(batch) < self.batch_size:
            if not self._order:
                self._order = torch.randperm(len(self.rows), generator=self.generator).tolist()
            batch.append(self.rows[self._order.pop(0)])
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "order": list(self._order),
            "num_rows": len(self.rows),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved position; with a different number of rows (data fixed since the
        checkpoint), the rest of the saved pass is dropped and a fresh shuffle begins."""
        self.generator.set_state(state["generator"])
        self._order = list(state["order"])
        saved = state.get("num_rows", len(self.rows))
        if saved != len(self.rows):
            warnings.warn(
                f"the training set has {len(self.rows)} rows, {saved} when the checkpoint was "
                "written: its order no longer applies, so a fresh shuffled pass begins",
                RuntimeWarning,
                stacklevel=2,
            )
            self._order = []


def _as_sink(sink: Any) -> Callable[[dict[str, Any], int], None]:
    """A MetricsLogger (.log(metrics, step)), a callable f(metrics, step), a list, or None."""
    if sink is None:
        return lambda metrics, step: None
    if isinstance(sink, list):
        return lambda metrics, step: sink.append({"step": step, **metrics})
    if callable(getattr(sink, "log", None)):
        return sink.log
    if callable(sink):
        return sink
    raise TypeError(
        f"sink: got {type(sink).__name__}; allowed: a metrics logger, a callable, a list or None"
    )


class TrainingLoop:
    """`schedule.num_steps` GRPO steps on batches from `sampler`, evaluated and logged."""

    def __init__(
        self,
        trainer: GRPOTrainer,
        sampler: Iterator[list[Any]],
        schedule: ScheduleConfig,
        *,
        evaluate: Evaluator | None = None,
        eval_every: int = 0,
        sink: Any = None,
        max_staleness: int = 0,
        rollout_worker: str = "thread",
    ) -> None:
        """`trainer.optimizer` gets the schedule; `evaluate()` -> (metrics, samples) or None.
        `max_staleness` >= 1: later steps are sampled while the trainer updates
        (`grpo.run.overlap`) in a `rollout_worker` thread or process; 0: every step
        samples, then updates."""
        from transformers import get_scheduler

        check_int("evaluation", "every", eval_every, minimum=0)
        check_int("run", "max_staleness", max_staleness, minimum=0)
        check_overlap(trainer, max_staleness, distributed.world_size())
        self.producer = None  # no thread at all with max_staleness 0
        if max_staleness:
            check_rollout_worker(rollout_worker)
            self.producer = ROLLOUT_WORKERS[rollout_worker](
                trainer.policy, trainer.reward_model, sampler, trainer.config.group_size,
                max_staleness, schedule.num_steps,
            )  # fmt: skip
        self.trainer = trainer
        self.sampler = sampler
        self.schedule = schedule
        self.evaluator = evaluate
        self.eval_every = eval_every
        self.sink = _as_sink(sink)
        self.scheduler = get_scheduler(
            SCHEDULERS[schedule.lr_scheduler],
            trainer.optimizer,
            num_warmup_steps=schedule.warmup_steps,
            num_training_steps=schedule.num_steps,
        )
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self._start_reward: float | None = None

    @property
    def done(self) -> bool:
        return self.step >= self.schedule.num_steps

    def train(self, after_step: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
        """Run to the end (resuming at `self.step`); `after_step(step)` e.g. checkpoints."""
        if self.step == 0 and not self.evaluations:
            self.evaluate()
        try:
            while not self.done:
                self.train_step()
                if self.eval_every and self.step % self.eval_every == 0 and not self.done:
                    self.evaluate()
                if self.done:
                    self.evaluate()
                if after_step is not None:
                    after_step(self.step)
        finally:
            self.close()
        return self.history

    def close(self) -> None:
        """Stop the rollout producer (thread or process) and free what it holds. `train` does
        at its end; a loop driven by `train_step` calls it, or runs in a `with` block."""
        if self.producer is not None:
            self.producer.close()

    def __enter__(self) -> TrainingLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def train_step(self) -> dict[str, Any]:
        """One GRPO step on the next batch of states; returns (and logs) its metrics."""
        lr = self.trainer.optimizer.param_groups[0]["lr"]
        if self.producer is not None:
            metrics = overlapped_step(self.producer, self.trainer, self.step)
        else:  # dynamic sampling draws its extra states from the same sampler
            refill = lambda: next(self.sampler)  # noqa: E731
            metrics = dict(self.trainer.train_step(next(self.sampler), refill=refill))
        self.scheduler.step()
        self.step += 1
        if self.producer is None:  # overlapped: the sampler's, in the step's metrics already
            metrics.update(hook(self.trainer.policy, "rollout_metrics") or {})
            metrics.update(hook(self.trainer.reward_model, "last_metrics") or {})
        if self._start_reward is None:
            self._start_reward = metrics["reward/mean"]
        metrics["reward/start"] = self._start_reward
        metrics["reward/change"] = metrics["reward/mean"] - self._start_reward
        if "loss/kl" in metrics:
            kl, pg = abs(metrics["loss/kl"]), abs(metrics.get("loss/policy", 0.0))
            metrics["loss/kl_share"] = kl / (kl + pg) if kl + pg > 0 else 0.0
        metrics["lr"] = lr
        self.history.append(metrics)
        self.sink(metrics, self.step)
        return metrics

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics now, logged with their samples; {} without an evaluator."""
        if self.evaluator is None:
            return {}
        start = time.perf_counter()
        paused = self.producer.paused() if self.producer is not None else contextlib.nullcontext()
        with paused, randomness_kept(self.trainer.policy):
            metrics, samples = self.evaluator()
        record = {**metrics, "eval/samples": samples}
        self.evaluations.append({"step": self.step, **record})
        self.sink({**record, "time/eval": time.perf_counter() - start}, self.step)
        return record

    # ------------------------------------------------------------- resumable state
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (tensors and plain values; see `GRPOTrainer.state_dict`)."""
        drawn = None if self.producer is None else self.producer.resume_state(self.step)
        if drawn is None:  # with a producer, batches drawn but not trained on are re-sampled
            sampling = hook(self.trainer.policy, "sampling_state")
            sampler = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else None
            drawn = {
                "sampler": sampler,
                "policy_sampling": sampling() if callable(sampling) else None,
            }
        return {
            "trainer": self.trainer.state_dict(),
            "step": self.step,
            "start_reward": self._start_reward,
            "history": self.history,
            "evaluations": self.evaluations,
            "sampler": drawn["sampler"],
            "scheduler": self.scheduler.state_dict(),
            "policy_sampling": drawn["policy_sampling"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.producer is not None:  # it drew from the state replaced here
            self.producer.forget_drawn()
        self.trainer.load_state_dict(state["trainer"])
        self.step = int(state["step"])
        self._start_reward = state["start_reward"]
        self.history = list(state["history"])
        self.evaluations = list(state["evaluations"])
        if state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["policy_sampling"] is not None:
            self.trainer.policy.load_sampling_state(state["policy_sampling"])


@contextlib.contextmanager
def randomness_kept(policy: Any) -> Iterator[None]:
    """Run the body, then put the policy's sampling state and the global torch RNG (CPU, and
    the current CUDA device's) back as they were."""
    get_state = hook(policy, "sampling_state")
    state = get_state() if get_state is not None else None
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            if get_state is not None:
                policy.load_sampling_state(state)
