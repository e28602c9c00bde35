"""bench/roofline_memory.py: a phase's peak resident memory is the largest while it ran, not
before it or after it, and the step timer's phases are watched only while asked."""

from __future__ import annotations

import contextlib
import mmap
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import roofline_memory  # noqa: E402

from grpo.step.timing import StepTimer  # noqa: E402

MIB = 2**20
pytestmark = pytest.mark.skipif(not roofline_memory.reset_peak(),
                                reason="the kernel does not let this process reset its peak RSS")  # fmt: skip


@contextlib.contextmanager
def touched(mib: int) -> Iterator[None]:
    """`mib` MiB of anonymous memory mapped, every page written (so resident), and unmapped
    on leaving. Mapped directly: a freed tensor may stay in malloc's heap, resident, and a new
    one may reuse pages already resident, so neither would move the process's RSS for sure."""
    pages = mmap.mmap(-1, mib * MIB)
    try:
        for offset in range(0, mib * MIB, mmap.PAGESIZE):
            pages[offset] = 1
        yield
    finally:
        pages.close()


def test_a_buffer_freed_inside_a_phase_shows_in_its_peak_and_not_the_next():
    """64 MiB allocated and freed inside "sampling" lift its peak at least 48 MiB over the
    "optimizer" phase that follows (its mark restarts at the boundary); the timer still times."""
    memory, timer = roofline_memory.PhasePeaks(), StepTimer()
    with memory.watching(StepTimer):
        with timer.phase("sampling"), touched(64):
            pass
        with timer.phase("optimizer"):
            pass
    assert memory.peak("sampling") - memory.peak("optimizer") >= 48 * MIB
    assert memory.peak("optimizer") >= roofline_memory.status_bytes("VmRSS") - 16 * MIB
    assert memory.peak("loss_backward") is None  # never entered
    assert timer.seconds["sampling"] > 0


def test_a_phase_entered_twice_keeps_its_larger_peak_and_an_outer_phase_covers_an_inner():
    """The second of two entries held 64 MiB more than the first: the phase's peak is that
    one's; a phase open around it has at least the same peak."""
    memory = roofline_memory.PhasePeaks()
    with memory.entered("outer"):
        with memory.entered("loss"):
            pass
        with memory.entered("loss"), touched(64):
            pass
    after = roofline_memory.status_bytes("VmRSS")
    assert memory.peak("outer") >= memory.peak("loss") >= after + 48 * MIB
    memory.clear()
    assert memory.peak("loss") is None


def test_the_timer_is_watched_only_inside_the_block():
    """`watching` puts StepTimer.phase back as it was, also after an error."""
    timed = StepTimer.phase
    memory = roofline_memory.PhasePeaks()
    with pytest.raises(RuntimeError), memory.watching(StepTimer):
        assert StepTimer.phase is not timed
        raise RuntimeError("inside")
    assert StepTimer.phase is timed
    with StepTimer().phase("sampling"):
        pass
    assert memory.peak("sampling") is None


def test_a_missing_status_field_is_named():
    with pytest.raises(ValueError, match="no 'VmNothing'"):
        roofline_memory.status_bytes("VmNothing")
