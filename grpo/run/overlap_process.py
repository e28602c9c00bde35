"""`ProcessRolloutProducer`: the producer of `grpo.run.overlap` in a process of its own.

`run.rollout_worker: process` (CPU only). A sampling thread shares the interpreter lock
with the trainer: on a small model, where much of each stage is Python between small
kernels, the two threads take turns instead of running side by side. A forked process
shares nothing but what it is given:

- **its policy** is the trainer's as it was at the fork (copy-on-write pages, so no
  copy is made up front): the process's own, as the thread's `copy.deepcopy` is;
- **weights** travel through k + 1 slots of shared memory, each the size of the
  trainable parameters (an anonymous shared mapping), made before the fork.
  Version v goes to slot v mod (k + 1). The slot is written again only with version
  v + k + 1, after step v + k is trained; that step's batch was sampled with version
  v, which the process had copied into its model before sampling it. So a slot is
  never written while it may still be read, with no lock;
- **batches** come back pickled by value through a pipe, with the prompt sampler's
  and sampling seeds' state before each draw (for checkpoints), and an error raised
  in the process as the same exception with the process's traceback as a note.

Which weights sample which step is the thread's rule (`sampling_version`), so a run
with k >= 1 is reproducible from its seed. The process samples with its own copy of
torch's generator (forked at the start), so evaluation need not pause it and draws the
same numbers whichever worker runs. A process that dies (killed, out of memory) is
noticed within `POLL_SECONDS` of the trainer waiting on it: the error names its exit
code and the step in flight. A trainer killed outright leaves a process that notices
its parent gone and exits.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import multiprocessing
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from grpo.run.overlap import (
    Producer,
    RolloutProducer,
    StampedBatch,
    copy_weights,
    drawn_state,
    sample_stamped,
)  # fmt: skip
from grpo.step.staleness import sampling_version
from grpo.step.timing import memory_metrics

__all__ = ["ROLLOUT_WORKERS", "ProcessRolloutProducer", "RolloutProcessError"]

POLL_SECONDS = 0.5  # how often a waiting side checks that the other is alive


class RolloutProcessError(RuntimeError):
    """The rollout process ended without handing over what the trainer waits for."""


class _Stop(Exception):
    """The trainer closed the producer (or is gone)."""


class ProcessRolloutProducer(Producer):
    """Samples the batches of steps `start .. num_steps - 1` in a forked process, k versions
    ahead; the same methods as `RolloutProducer` (the thread)."""

    def __init__(
        self, policy: Any, reward_model: Any, sampler: Any, group_size: int,
        max_staleness: int, num_steps: int,
    ) -> None:  # fmt: skip
        super().__init__(policy, reward_model, sampler, group_size, max_staleness, num_steps)
        self._context = multiprocessing.get_context("fork")
        self._process: Any = None
        self._batches: dict[int, StampedBatch] = {}
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._process is not None

    def start(self, step: int) -> None:
        """Fork the process that samples from step `step` on, the policy's weights now being
        version `step`; after an earlier start, from where the prompts and seeds were."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            raise RuntimeError(
                "run.rollout_worker=process: CUDA is initialised in this process and cannot be "
                "used in a forked one; allowed on a GPU: rollout_worker thread"
            )
        drawn = self._resume.get(step)
        if drawn is not None and drawn["sampler"] is not None:
            self.sampler.load_state_dict(drawn["sampler"])
        self.first = step
        self._resume.clear()
        self._batches.clear()
        self._error = None
        self._slots = [_shared_slot(self._params()) for _ in range(self.k + 1)]
        self._versions = self._context.Queue()  # trainer -> process: a version is in its slot
        self._results = self._context.Queue()  # process -> trainer: (kind, step, payload)
        self._stopping = self._context.Event()
        self._process = self._context.Process(
            target=self._run, args=(os.getpid(), torch.get_num_threads(), drawn),
            name="grpo-rollouts", daemon=True,
        )  # fmt: skip
        gc.freeze()  # the process's collections then leave the trainer's objects (and
        try:  # their pages, shared until written) alone
            self._process.start()
        finally:
            gc.unfreeze()

    def publish(self, version: int) -> float:
        """Write the policy's weights now as `version` into its slot (after an update);
        returns the seconds the copy took (0 when no later step samples with it)."""
        if not self.needed(version):
            return 0.0
        begin = time.perf_counter()
        copy_weights(self._slots[version % (self.k + 1)], dict(self._params()))
        self._versions.put(version)
        return time.perf_counter() - begin

    def next_batch(self, step: int) -> tuple[StampedBatch, float]:
        """The batch of `step` and the seconds waited for it; a process error is re-raised."""
        begin = time.perf_counter()
        self._receive(lambda: step in self._batches, f"step {step}'s batch")
        return self._batches.pop(step), time.perf_counter() - begin

    def resume_state(self, step: int) -> dict[str, Any] | None:
        """The prompt sampler's and the sampling seeds' state before the batch of `step` was
        drawn (waiting for it while the process runs); None when it never started."""
        if self._process is not None and self._error is None:
            with contextlib.suppress(RolloutProcessError):  # ended: what it sent is all there is
                self._receive(lambda: step in self._resume, f"the state before step {step}")
        return self._resume.get(step)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing to pause: the process draws from its own copy of torch's generator."""
        yield

    def close(self) -> None:
        """Stop the process (after the batch it is sampling) and drop what it sent."""
        if self._process is None:
            return
        self._stopping.set()
        self._versions.put(None)  # wakes it if it waits for weights
        deadline = time.monotonic() + 60.0
        while self._process.is_alive() and time.monotonic() < deadline:
            self._take(timeout=0.05)  # a full pipe would block its exit
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        while self._take(timeout=0):  # states sent before it ended, for the checkpoint
            pass
        for channel in (self._versions, self._results):
            channel.close()
            channel.cancel_join_thread()
        self._process = None
        self._batches.clear()
        self._slots = []

    def _params(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p.detach()) for n, p in self.policy.get_parameters().items()]

    def _receive(self, ready: Any, what: str) -> None:
        """Take what the process sent until `ready()`; raise its error, or its death's."""
        while not ready():
            if self._error is not None:
                raise self._error
            if not self._take(timeout=POLL_SECONDS) and not self._process.is_alive():
                self._error = RolloutProcessError(
                    f"the rollout process (pid {self._process.pid}) exited with code "
                    f"{self._process.exitcode} while the trainer waited for {what}"
                )

    def _take(self, timeout: float) -> bool:
        """File one message from the process; False when none came within `timeout`."""
        try:
            kind, step, payload = pickle.loads(self._results.get(timeout=timeout))
        except queue.Empty:
            return False
        if kind == "batch":
            self._batches[step] = payload
        elif kind == "drawn":
            self._resume[step] = payload
            self._resume.pop(step - self.k - 2, None)  # long trained on
        else:
            self._error = payload
        return True

    # ------------------------------------------------------------------ the process
    def _run(self, parent: int, threads: int, drawn: dict[str, Any] | None) -> None:
        # GNU OpenMP is not fork-safe: the forked main thread still holds the parent's team
        # of worker threads, which do not exist here, and hangs in its first parallel
        # region. A new thread starts a team of its own.
        worker = threading.Thread(target=self._sample, args=(parent, threads, drawn))
        worker.start()
        worker.join()

    def _sample(self, parent: int, threads: int, drawn: dict[str, Any] | None) -> None:
        torch.set_num_threads(threads)  # the same split as the trainer's
        self._parent, self._loaded, self._published = parent, self.first, self.first
        if drawn is not None and drawn["policy_sampling"] is not None:
            self.policy.load_sampling_state(drawn["policy_sampling"])
        step = self.first
        try:
            for step in range(self.first, self.num_steps):
                version = sampling_version(step, self.k, self.first)
                wait = self._load(version)
                self._send("drawn", step, drawn_state(self.policy, self.sampler))
                if self._stopping.is_set():
                    raise _Stop  # closed: the state before this draw is sent, nothing more
                batch = sample_stamped(
                    self.policy, self.reward_model, next(self.sampler), self.G, step, version
                )
                batch.metrics["time/wait_weights"] = wait
                batch.metrics.update({  # this process's own (pages shared with the trainer
                    key.replace("memory/", "memory/sampler/"): value  # count in both)
                    for key, value in memory_metrics().items()
                })  # fmt: skip
                self._send("batch", step, batch)
            self._send("drawn", self.num_steps, drawn_state(self.policy, self.sampler))
        except _Stop:
            pass
        except BaseException as err:  # raised in the trainer at its next wait
            self._send("error", step, _portable(err, step))
        self._results.close()
        self._results.join_thread()  # everything sent is in the pipe before the exit

    def _send(self, kind: str, step: int, payload: Any) -> None:
        """Pickled here by value (tensors too: nothing refers back to this process)."""
        self._results.put(pickle.dumps((kind, step, payload), pickle.HIGHEST_PROTOCOL))

    def _load(self, version: int) -> float:
        """Make `version` the model's weights (waiting for it); returns the seconds waited."""
        if version == self._loaded:
            return 0.0
        begin = time.perf_counter()
        while self._published < version:
            try:
                published = self._versions.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if os.getppid() != self._parent:
                    raise _Stop from None  # the trainer is gone
                continue
            if published is None:
                raise _Stop
            self._published = published
        waited = time.perf_counter() - begin
        copy_weights(self.policy.get_parameters(), self._slots[version % (self.k + 1)])
        self._loaded = version
        return waited


def _shared_slot(params: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Tensors shaped as `params` in one anonymous shared mapping: a forked process sees the
    same pages (no file, so no /dev/shm to fill)."""
    sizes = [-(-p.numel() * p.element_size() // 64) * 64 for _, p in params]  # 64-byte aligned
    buffer = mmap.mmap(-1, max(sum(sizes), 64))  # MAP_SHARED | MAP_ANONYMOUS
    slot, offset = {}, 0
    for (name, p), size in zip(params, sizes, strict=True):
        if p.numel():
            flat = torch.frombuffer(buffer, dtype=p.dtype, count=p.numel(), offset=offset)
            slot[name] = flat.view(p.shape)
        else:
            slot[name] = torch.empty_like(p, device="cpu")
        offset += size
    return slot


def _portable(err: BaseException, step: int) -> BaseException:
    """`err` with the process's traceback as a note; a RolloutProcessError naming it where
    it does not pickle."""
    note = f"raised in the rollout process, sampling step {step}:\n" + "".join(
        traceback.format_exception(err)
    )
    with contextlib.suppress(Exception):
        err.add_note(note)
        pickle.loads(pickle.dumps(err))  # some exceptions pickle but cannot be rebuilt
        return err
    return RolloutProcessError(f"{type(err).__name__}: {err}\n{note}")


ROLLOUT_WORKERS = {"thread": RolloutProducer, "process": ProcessRolloutProducer}
"""`run.rollout_worker`: where the producer of an overlapped run samples."""
