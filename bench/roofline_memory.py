"""Peak resident memory (RSS) of each phase of a step: the kernel's high-water mark, reset at
every phase boundary.

Linux keeps a process's peak resident size (`VmHWM` in /proc/self/status) and lets the process
reset it to the current size by writing 5 to /proc/self/clear_refs (Linux 4.0 and later;
`bench/real_model_memory.py` does the same around a whole step). `PhasePeaks` wraps the step
timer's phases (`grpo.step.timing.StepTimer.phase`, the same boundaries as the step's
`time/...` metrics): at every boundary, entering or leaving a phase, it reads the mark into
each phase still open and resets it. A phase's peak is thus the largest resident size while it
ran, over all its entries in the step (the loss enters once per mini-batch).

Why the high-water mark rather than a thread reading VmRSS every few milliseconds: the kernel
sees every page the process touches, so a peak shorter than any sampling interval (a logits
tensor allocated and freed inside one forward) is still caught, and nothing runs alongside the
step to take a core or the GIL from it. The boundaries themselves cost a write and a read of
/proc files, outside the timed phase. The kernel keeps its page counts per CPU and reads them
with an error of a few dozen pages per CPU, far below the megabytes compared here.
Where clear_refs cannot be written (not Linux, or a kernel that refuses it) no peak is
recorded: `PhasePeaks.available` is False and every peak is None.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PhasePeaks", "reset_peak", "status_bytes"]

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (`VmRSS`, `VmHWM`: given in kB) in bytes."""
    for line in STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"status_bytes: no {field!r} in {STATUS}")


def reset_peak() -> bool:
    """Reset this process's peak resident size to its current size; False where the kernel
    does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PhasePeaks:
    """The peak resident bytes of each named phase since `clear()` (see the module docstring)."""

    def __init__(self) -> None:
        self.available = reset_peak()
        self.open: list[str] = []  # the phases entered and not yet left, outermost first
        self.clear()

    def clear(self) -> None:
        self.peaks: dict[str, int] = {}

    def _boundary(self) -> None:
        """Fold the mark since the last boundary into every open phase, and restart it."""
        if not self.available:
            return
        mark = status_bytes("VmHWM")
        for name in self.open:
            self.peaks[name] = max(self.peaks.get(name, 0), mark)
        reset_peak()

    @contextlib.contextmanager
    def entered(self, name: str) -> Iterator[None]:
        """Count the `with` block as phase `name` (phases may nest: the outer one's peak
        covers the inner one's)."""
        self._boundary()
        self.open.append(name)
        try:
            yield
        finally:
            self._boundary()
            self.open.remove(name)

    def peak(self, name: str) -> int | None:
        """Phase `name`'s peak in bytes; None where it never ran or nothing was measured."""
        return self.peaks.get(name)

    @contextlib.contextmanager
    def watching(self, timer_class: type) -> Iterator[PhasePeaks]:
        """Within the block, every `timer_class.phase(name)` (the step timer's) is also a phase
        here, its boundaries outside the timed span."""
        timed = timer_class.phase
        watched = self

        @contextlib.contextmanager
        def phase(timer: object, name: str) -> Iterator[None]:
            with watched.entered(name), timed(timer, name):
                yield

        timer_class.phase = phase
        try:
            yield self
        finally:
            timer_class.phase = timed
