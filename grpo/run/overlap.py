"""`RolloutProducer`: the batches of later steps sampled while the trainer updates.

With `run.max_staleness` k >= 1 the run loop takes each step's samples from a
producer thread instead of sampling them itself (or from a process:
`grpo.run.overlap_process`, which follows the same rules). The producer samples with its
own copy of the policy (`copy.deepcopy`, made when it starts), so the sampler
never reads weights the optimizer is writing: after every update the loop
publishes a copy of the trained parameters (one clone per version, `time/publish_weights`),
and the producer loads the version a step needs into its copy between batches.

Which weights sample which step is fixed (`grpo.step.staleness.sampling_version`):
the batch of step s is sampled with version s - k (never before the version the
producer started from), so a group is never more than k versions old and an
overlapped run is reproducible from its seed whatever the threads' timing (under
bf16 autocast, with its weight cache off while the thread runs: `grpo.precision`). The
producer waits for that version (`time/wait_weights`), the trainer for the batch
(`time/wait_samples`); a bounded queue of k batches sits between them.

A stale batch (sampled with older weights than it is trained with) carries the
sampler's own log-probs (`grpo.run.stamped`): the trainer recomputes log π_old and
the loss is AReaL's decoupled objective (`grpo.step.objective`), each token weighed by
min(π_old / π_sampler, `rollout.tis_cap`), its gap and capped share logged as a
synchronous rollout's engine gap is (`rollout/logprob_gap_*`, `rollout/tis_capped_frac`).

Threads: torch's intra-op thread count is process-wide (`torch.set_num_threads`
in one thread sets it for all), so each stage computes with `run.threads` threads
and the two stages together use twice that many cores.

Random numbers: sampling seeds itself through a fork of torch's global generator,
so evaluation (which samples too) pauses the producer (`paused`); the training pass
itself must draw none (dropout off, the default) for a run to be reproducible.

Closing (`close`, which `TrainingLoop.close` and its `with` block call) stops the
thread after the batch it is sampling: it draws nothing more, and its copy is freed.

Checkpoints hold the state before the first batch not yet trained on: a resumed
run samples the queued batches again, with the checkpoint's weights (staleness 0
for its first k steps, as at the start of a run), so it is not bit-identical to the
uninterrupted run. With k = 0 there is no producer and resuming stays bit-exact.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from grpo.functional.importance import MISMATCH_KEYS
from grpo.precision import hold_weight_cache_off, release_weight_cache
from grpo.protocols import hook
from grpo.run.stamped import (
    Producer,
    StampedBatch,
    copy_weights,
    drawn_state,
    sample_stamped,
)
from grpo.step.staleness import StalenessLog, admitted, sampling_version, staleness_metrics

__all__ = ["RolloutProducer", "check_overlap", "overlapped_step"]


class _Stop(Exception):
    """The producer was closed: no more batches are wanted."""


class RolloutProducer(Producer):
    """Samples the batches of steps `start .. num_steps - 1` in a thread, k versions ahead."""

    def __init__(
        self, policy: Any, reward_model: Any, sampler: Any, group_size: int,
        max_staleness: int, num_steps: int,
    ) -> None:  # fmt: skip
        super().__init__(policy, reward_model, sampler, group_size, max_staleness, num_steps)
        self.sampling_lock = threading.Lock()  # held while sampling; evaluation takes it too
        self._cond = threading.Condition()
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}  # version -> parameters
        self._queue: queue.Queue[StampedBatch | BaseException] = queue.Queue(maxsize=max_staleness)
        self._thread: threading.Thread | None = None
        self._copy: Any = None  # the policy copy the thread samples with, while it runs
        self._stop = False

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def closing(self) -> bool:
        """True once `close` was asked (until the next `start`): the thread draws no new batch."""
        return self._stop

    @property
    def sampling_policy(self) -> Any:
        """The copy of the policy the thread samples with; None before `start`, after `close`."""
        return self._copy

    def start(self, step: int) -> None:
        """Sample from step `step` on, with the policy's weights now as version `step`; after
        an earlier start, from where the prompts and seeds were before `step`'s batch."""
        drawn = self._resume.get(step)  # an interrupted run: its queue is sampled again
        self.first = step
        self._stop = False
        self._snapshots.clear()
        self._resume.clear()
        self._queue = queue.Queue(maxsize=self.k)
        self._copy = copy.deepcopy(self.policy)  # the sampler's own weights
        self._loaded = step
        if drawn is not None:
            if drawn["sampler"] is not None:
                self.sampler.load_state_dict(drawn["sampler"])
            if drawn["policy_sampling"] is not None:
                self._copy.load_sampling_state(drawn["policy_sampling"])
        hold_weight_cache_off()  # grpo.precision: autocast's cache is shared by the threads
        self._thread = threading.Thread(target=self._run, name="grpo-rollouts", daemon=True)
        self._thread.start()

    def publish(self, version: int) -> float:
        """Offer the policy's weights now as `version` (after an update); returns the seconds
        the copy took (0 when no later step samples with this version)."""
        if not self.needed(version):
            return 0.0
        begin = time.perf_counter()
        params = {n: p.detach().clone() for n, p in self.policy.get_parameters().items()}
        with self._cond:
            self._snapshots[version] = params
            self._cond.notify_all()
        return time.perf_counter() - begin

    def next_batch(self, step: int) -> tuple[StampedBatch, float]:
        """The batch of `step` and the seconds waited for it; a producer error is re-raised."""
        begin = time.perf_counter()
        item = self._queue.get()
        waited = time.perf_counter() - begin
        if isinstance(item, BaseException):
            raise item
        if item.step != step:
            raise RuntimeError(f"the producer delivered step {item.step}'s batch for step {step}")
        return item, waited

    def resume_state(self, step: int) -> dict[str, Any] | None:
        """The prompt sampler's and the sampling seeds' state before the batch of `step` was
        drawn (waiting for it while the thread runs); None when it never started."""
        with self._cond:
            if self._thread is not None:
                self._cond.wait_for(lambda: step in self._resume or self._stop)
            return self._resume.get(step)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No sampling in the producer inside this block (it samples with torch's global
        generator, so the caller may sample too)."""
        with self.sampling_lock:
            yield

    def close(self) -> None:
        """Stop the thread (after the batch it is sampling: it draws no other), drop what is
        queued, and free its copy of the policy and the weights offered to it."""
        if self._thread is None:
            return
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)  # unblock a producer waiting to put
        while not self._queue.empty():  # a batch put as the thread ended
            self._queue.get_nowait()
        self._thread, self._copy = None, None
        self._snapshots.clear()
        release_weight_cache()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            for step in range(self.first, self.num_steps):
                batch = self._produce(step)
                while True:  # hand it over, unless closed meanwhile
                    if self._stop:
                        raise _Stop
                    with contextlib.suppress(queue.Full):
                        self._queue.put(batch, timeout=0.05)
                        break
            with self._cond:  # a checkpoint after the last step resumes from here
                self._resume[self.num_steps] = drawn_state(self._copy, self.sampler)
                self._cond.notify_all()
        except _Stop:
            pass
        except BaseException as err:  # handed to the trainer's thread, raised there
            with self._cond:
                self._stop = True  # nothing more comes: no one waits on this thread
                self._cond.notify_all()
            self._queue.put(err)

    def _produce(self, step: int) -> StampedBatch:
        """Wait for the weights `step` samples with, load them, draw and score its batch."""
        version = sampling_version(step, self.k, self.first)
        wait = self._load(version)
        with self._cond:
            self._resume[step] = drawn_state(self._copy, self.sampler)
            self._resume.pop(step - self.k - 2, None)  # long trained on
            self._cond.notify_all()
            if self._stop:  # closed: this batch is not wanted, so it is not drawn
                raise _Stop
        with self.sampling_lock:
            batch = sample_stamped(
                self._copy, self.reward_model, next(self.sampler), self.G, step, version
            )
        batch.metrics["time/wait_weights"] = wait
        return batch

    def _load(self, version: int) -> float:
        """Make `version` the copy's weights (waiting for it); returns the seconds waited."""
        if version == self._loaded:
            return 0.0
        begin = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: version in self._snapshots or self._stop)
            if self._stop:
                raise _Stop
            params = self._snapshots[version]
            for old in [v for v in self._snapshots if v <= version]:
                del self._snapshots[old]  # never needed again: versions only grow
        waited = time.perf_counter() - begin
        copy_weights(self._copy.get_parameters(), params)
        self._loaded = version
        return waited


def check_overlap(trainer: Any, max_staleness: int, world_size: int) -> None:
    """Refuse what overlapped rollouts do not support, naming the setting."""
    if max_staleness == 0:
        return
    if trainer.config.dynamic_sampling:
        raise ValueError(
            f"run.max_staleness={max_staleness} with grpo.dynamic_sampling: a step's extra "
            "rounds cannot be sampled ahead; allowed: max_staleness 0, or dynamic_sampling false"
        )
    if world_size > 1:
        raise ValueError(
            f"run.max_staleness={max_staleness} under {world_size} processes; allowed: "
            "max_staleness 0 with more than one process"
        )


def overlapped_step(producer: RolloutProducer, trainer: Any, step: int) -> dict[str, float]:
    """Train step `step` on the producer's batch, then publish the new weights; the trainer's
    metrics with the sampler's and the staleness ones (`grpo.step.staleness`)."""
    begin = time.perf_counter()
    if not producer.running:
        producer.start(step)
    batch, waited = producer.next_batch(step)
    G = trainer.config.group_size
    groups = batch.rollout.num_samples // G
    if not all(admitted(step, [batch.version] * groups, producer.k)):
        raise RuntimeError(
            f"step {step} got groups sampled with version {batch.version}, more than "
            f"max_staleness={producer.k} versions old"
        )
    metrics = dict(trainer.train_step(batch.rollout.states[::G], rollout=batch.rollout))
    if batch.version == step:  # fresh: the policy's own engine gap, as a synchronous step's
        own = hook(trainer.policy, "rollout_metrics") or {}
        metrics.update({key: own[key] for key in MISMATCH_KEYS if key in own})
    published = producer.publish(step + 1)
    log = StalenessLog([step - batch.version] * groups, waited, batch.metrics["time/wait_weights"])
    metrics.update(batch.metrics)  # the sampler's: alongside the step, not inside it
    metrics.update(staleness_metrics(log))
    # the step as an operator sees it: waiting, updating, publishing; its phases still add up
    # to it (time/sampling and time/rewards are 0, the wait and the copy in time/other)
    wall = time.perf_counter() - begin
    update = metrics["time/step"] - metrics["time/other"]  # the trainer's named phases
    tokens = sum(getattr(a, "num_tokens", 1) for a in batch.rollout.actions)
    metrics.update({
        "staleness/sampler_version": float(batch.version),
        "time/publish_weights": published,
        "time/step": wall,
        "time/other": wall - update,
        "throughput/tokens_per_s": tokens / wall,
        "throughput/samples_per_s": batch.rollout.num_samples / wall,
    })  # fmt: skip
    return metrics
