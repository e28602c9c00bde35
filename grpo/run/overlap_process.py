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
- **batches** come back pickled by value through a pipe, each with the prompt
  sampler's and sampling seeds' state after its draw, which is the state before the
  next one (what a checkpoint saves); the state before the first draw is the
  trainer's own at the start. A thread of the trainer reads the pipe as messages
  come, so the process never waits on a full pipe, and the process writes each
  message before it goes on: what it sent is in the pipe if it is killed after.
- **errors** raised in the process reach the trainer as the same exception with the
  process's traceback as a note (Python >= 3.11; a `RolloutProcessError` naming it
  before, or where it does not pickle).

Which weights sample which step is the thread's rule (`sampling_version`), so a run
with k >= 1 is reproducible from its seed. The process samples with its own copy of
torch's generator (forked at the start), so evaluation need not pause it. A process
that dies (killed, out of memory) closes its end of the pipe: the trainer's next wait
raises a `RolloutProcessError` naming its exit code and the step awaited. A trainer
killed outright leaves a process that sees its parent gone (or its pipe broken) and
exits; Ctrl-C stops the trainer, which stops the process.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from grpo.precision import release_weight_cache
from grpo.run.overlap import RolloutProducer
from grpo.run.stamped import Producer, StampedBatch, copy_weights, drawn_state, sample_stamped
from grpo.step.staleness import sampling_version
from grpo.step.timing import memory_metrics

__all__ = [
    "ROLLOUT_WORKERS", "ProcessRolloutProducer", "RolloutProcessError", "check_rollout_worker",
]  # fmt: skip

POLL_SECONDS = 0.5  # how often a waiting side checks that the other is alive
CLOSE_SECONDS = 2.0  # close(): how long the process may take to stop before it is killed
DEAD_SECONDS = 2.0  # a dead process whose pipe has not ended (something it started holds it)


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
        self._cond = threading.Condition()  # guards what the reading thread files
        self._batches: dict[int, StampedBatch] = {}
        self._error: BaseException | None = None
        self._ended = False  # the pipe reached its end: the process is gone

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
        self._resume = {
            step: drawn if drawn is not None else drawn_state(self.policy, self.sampler)
        }
        self._batches.clear()
        self._error, self._ended = None, False
        self._slots = [_shared_slot(self._params()) for _ in range(self.k + 1)]
        self._versions = self._context.Queue()  # trainer -> process: a version is in its slot
        self._stopping = self._context.Event()
        receiving, sending = self._context.Pipe(duplex=False)  # process -> trainer
        process = self._context.Process(
            target=self._run, args=(os.getpid(), torch.get_num_threads(), drawn, receiving, sending),
            name="grpo-rollouts", daemon=True,
        )  # fmt: skip
        gc.freeze()  # the process's collections then leave the trainer's objects (and
        try:  # their pages, shared until written) alone
            process.start()
        except BaseException:
            receiving.close()
            raise
        finally:
            gc.unfreeze()
            sending.close()  # the process's end: with it gone, its death ends the pipe
        self._process = process
        self._reading = threading.Thread(
            target=self._read, args=(receiving,), name="grpo-rollouts-pipe", daemon=True
        )
        self._reading.start()

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
        dead_since: float | None = None
        with self._cond:
            while step not in self._batches:
                if self._error is not None:
                    raise self._error
                if dead_since is None and not self._process.is_alive():
                    dead_since = time.monotonic()  # its last bytes may still be in the pipe
                dead = dead_since is not None and time.monotonic() - dead_since > DEAD_SECONDS
                if self._ended or dead:
                    self._process.join(timeout=5.0)
                    raise RolloutProcessError(
                        f"the rollout process (pid {self._process.pid}) exited with code "
                        f"{self._process.exitcode} while the trainer waited for step {step}'s "
                        "batch"
                    )
                self._cond.wait(POLL_SECONDS)
            return self._batches.pop(step), time.perf_counter() - begin

    def resume_state(self, step: int) -> dict[str, Any] | None:
        """The prompt sampler's and the sampling seeds' state before the batch of `step` was
        drawn (sent with the batch before it); None when the process never started."""
        with self._cond:
            if not self._resume:
                return None
            if step not in self._resume:
                raise RolloutProcessError(
                    f"no state from before step {step}'s draw: the rollout process delivered "
                    f"the batches up to step {max(self._resume) - 1}"
                )
            return self._resume[step]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing to pause: the process draws from its own copy of torch's generator."""
        yield

    def close(self) -> None:
        """Stop the process (killed if it does not stop within `CLOSE_SECONDS`: a batch
        it is sampling is not wanted) and drop what it sent ahead."""
        if self._process is None:
            return
        self._stopping.set()
        self._versions.put(None)  # wakes it if it waits for weights
        self._process.join(timeout=CLOSE_SECONDS)  # every state a checkpoint needs came with
        if self._process.is_alive():  # a batch already delivered: the one in hand can go
            self._process.kill()
            self._process.join()
        self._reading.join(timeout=5.0)  # the pipe has ended with the process
        self._versions.close()
        self._versions.cancel_join_thread()
        self._process = None
        self._batches.clear()
        self._slots = []

    def _params(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p.detach()) for n, p in self.policy.get_parameters().items()]

    def _read(self, receiving: Any) -> None:
        """The trainer's reading thread: file each message until the pipe ends."""
        while True:
            try:
                kind, step, *payload = pickle.loads(receiving.recv_bytes())
            except (EOFError, OSError):  # every sending end is closed: the process is gone
                break
            except Exception as err:  # a message that does not unpickle
                kind, step, payload = "error", -1, [err]
            with self._cond:
                if kind == "batch":
                    batch, after = payload
                    self._batches[step] = batch
                    self._resume[step + 1] = after  # the state before the next draw
                    self._resume.pop(step - self.k - 2, None)  # long trained on
                else:
                    self._error = payload[0]
                self._cond.notify_all()
        receiving.close()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ the process
    def _run(
        self, parent: int, threads: int, drawn: dict[str, Any] | None, receiving: Any,
        sending: Any,
    ) -> None:  # fmt: skip
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
        receiving.close()  # with the trainer gone, a write then fails instead of blocking
        # GNU OpenMP is not fork-safe: the forked main thread still holds the parent's team
        # of worker threads, which do not exist here, and hangs in its first parallel
        # region. A new thread starts a team of its own.
        worker = threading.Thread(target=self._sample, args=(parent, threads, drawn, sending))
        worker.start()
        worker.join()
        sending.close()

    def _sample(
        self, parent: int, threads: int, drawn: dict[str, Any] | None, sending: Any
    ) -> None:
        self._parent, self._loaded, self._published = parent, self.first, self.first
        step = self.first
        try:
            torch.set_num_threads(threads)  # the same split as the trainer's
            release_weight_cache(everything=True)  # no sampling thread beside this one here
            if drawn is not None and drawn["policy_sampling"] is not None:
                self.policy.load_sampling_state(drawn["policy_sampling"])
            for step in range(self.first, self.num_steps):
                version = sampling_version(step, self.k, self.first)
                wait = self._load(version)
                if self._stopping.is_set():
                    return  # closed: nothing more is wanted
                batch = sample_stamped(
                    self.policy, self.reward_model, next(self.sampler), self.G, step, version
                )
                batch.metrics["time/wait_weights"] = wait
                batch.metrics.update({  # this process's own (pages shared with the trainer
                    key.replace("memory/", "memory/sampler/"): value  # count in both)
                    for key, value in memory_metrics().items()
                })  # fmt: skip
                after = drawn_state(self.policy, self.sampler)
                _send(sending, ("batch", step, batch, after))
        except (_Stop, BrokenPipeError):
            pass  # closed, or the trainer is gone
        except BaseException as err:  # raised in the trainer at its next wait
            with contextlib.suppress(BrokenPipeError):
                _send(sending, ("error", step, _portable(err, step)))

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


def _send(sending: Any, message: tuple[Any, ...]) -> None:
    """Pickled here by value (tensors too: nothing refers back to this process), written
    before the caller goes on."""
    sending.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


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
    if hasattr(err, "add_note"):  # Python >= 3.11
        with contextlib.suppress(Exception):
            err.add_note(note)
            pickle.loads(pickle.dumps(err))  # some exceptions pickle but cannot be rebuilt
            return err
    return RolloutProcessError(f"{type(err).__name__}: {err}\n{note}")


ROLLOUT_WORKERS = {"thread": RolloutProducer, "process": ProcessRolloutProducer}
"""`run.rollout_worker`: where the producer of an overlapped run samples."""


def check_rollout_worker(name: Any) -> None:
    """Raise a ValueError naming `run.rollout_worker` unless `name` is in the table."""
    if name not in ROLLOUT_WORKERS:
        allowed = ", ".join(ROLLOUT_WORKERS)
        raise ValueError(f"run.rollout_worker: got {name!r}; allowed: {allowed}")
