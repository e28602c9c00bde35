"""Where a step's time and memory go: wall-clock seconds per phase, throughput, memory.

`StepTimer` measures one `GRPOTrainer.train_step`: the whole step and the
named `PHASES` inside it, each possibly entered several times (dynamic
sampling samples in rounds; every mini-batch has a backward pass). Whatever
lies outside the named phases (gathering rewards, advantages, mini-batch
assembly, refreshing the reference) is `time/other`, the step minus the
phases, so the phases add up to `time/step` by construction.

On CUDA every phase boundary synchronizes the device first: kernels are
queued asynchronously, and without a sync a phase's time would land in
whichever later phase first waits for the device. Off CUDA nothing syncs.

docs/metrics.md explains every key.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["NO_TIMER", "PHASES", "StepTimer", "memory_metrics"]

# the named phases of a step, in the order they run
PHASES = ("sampling", "rewards", "old_logprobs", "loss_backward", "optimizer")

GIB = 2**30


def _synchronize_cuda() -> None:
    """Wait for queued CUDA work, when this process has used CUDA at all."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepTimer:
    """Seconds per phase of one step, and the completions and tokens it sampled."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        synchronize: Callable[[], None] = _synchronize_cuda,
    ) -> None:
        self.clock = clock
        self.synchronize = synchronize
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.sampled_completions = 0
        self.sampled_tokens = 0
        self.synchronize()
        self._start = clock()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent inside the `with` block to phase `name`."""
        self.synchronize()
        begin = self.clock()
        try:
            yield
        finally:
            self.synchronize()
            self.seconds[name] += self.clock() - begin

    def count_sampled(self, actions: Sequence[Any]) -> None:
        """Count sampled actions and their tokens: `num_tokens` of a completion, else 1."""
        self.sampled_completions += len(actions)
        self.sampled_tokens += sum(getattr(a, "num_tokens", 1) for a in actions)

    def metrics(self, parallel: Any) -> dict[str, float]:
        """`time/...` and `throughput/...` of the step so far; `parallel.sum_metrics` adds up
        every process's samples and tokens (the step's time is this process's own)."""
        self.synchronize()
        step = self.clock() - self._start
        phases = {f"time/{name}": seconds for name, seconds in self.seconds.items()}
        counts = parallel.sum_metrics(
            {"tokens": float(self.sampled_tokens), "samples": float(self.sampled_completions)}
        )
        return {
            "time/step": step,
            **phases,
            "time/other": step - sum(self.seconds.values()),
            "throughput/tokens_per_s": counts["tokens"] / step if step > 0 else 0.0,
            "throughput/samples_per_s": counts["samples"] / step if step > 0 else 0.0,
        }


class _NoTimer:
    """Times nothing: what `sample_rollout` uses when no step is being measured."""

    def phase(self, name: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def count_sampled(self, actions: Sequence[Any]) -> None:
        pass


NO_TIMER = _NoTimer()


def memory_metrics() -> dict[str, float]:
    """This process's resident memory now and at its peak, and peak CUDA memory, in GiB.

    The resident size comes from /proc (Linux; absent elsewhere), the peak from
    `getrusage` (absent on Windows), the CUDA peak from PyTorch's allocator when
    CUDA is in use (since the process started or the last `reset_peak_memory_stats`).
    """
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
        out["memory/rss_gib"] = resident_pages * os.sysconf("SC_PAGE_SIZE") / GIB
    with contextlib.suppress(ImportError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
        peak_gib = peak * (1 if sys.platform == "darwin" else 1024) / GIB
        # the kernel's peak lags the current size by a few pages: never report less than now
        out["memory/peak_rss_gib"] = max(peak_gib, out.get("memory/rss_gib", 0.0))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["memory/cuda_max_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    return out
