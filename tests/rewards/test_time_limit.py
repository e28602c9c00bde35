"""Tests for grpo.rewards.time_limit: a block stopped after its seconds, in any thread."""

from __future__ import annotations

import time

import pytest
from threads import run_in_thread

from grpo.rewards.time_limit import TimeLimitExceeded, time_limit


def spin(seconds: float) -> None:
    """Python work for `seconds` of wall time (what a pathological parse does)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@pytest.mark.parametrize("in_thread", [False, True])
def test_spinning_python_stops_after_its_seconds_in_any_thread(in_thread):
    """A block spinning for 20 s under a 0.2 s limit raises its own TimeLimitExceeded within
    a few seconds, in the main thread and in another alike."""

    def work():
        begin = time.monotonic()
        limit = time_limit(0.2)
        try:
            with limit:
                spin(20.0)
        except limit.error:
            return time.monotonic() - begin
        return None

    seconds = run_in_thread(work, in_thread)
    assert seconds is not None and seconds < 5.0


def test_a_block_that_ends_in_time_leaves_nothing_behind():
    """Ended before its limit, a block raises nothing then or later (the timer is gone)."""
    with time_limit(0.2):
        spin(0.01)
    spin(0.5)  # well past the limit: a stray exception would be raised here
    with time_limit(None) as limit:  # None: no limit, no timer
        spin(0.05)
    assert issubclass(limit.error, TimeLimitExceeded)


def test_nested_limits_raise_their_own_and_an_inner_catch_does_not_swallow_the_outer():
    """An inner block that catches its own limit does not catch the outer one's, which stops
    the outer block; a reward's `except Exception` catches neither."""
    outer, stopped = time_limit(0.3), []
    with pytest.raises(outer.error), outer:
        for _ in range(100):
            inner = time_limit(10.0)
            try:
                with inner:
                    try:
                        spin(0.05)
                    except Exception:  # what a reward that swallows errors does
                        stopped.append("swallowed")
            except inner.error:
                stopped.append("inner")
    assert stopped == []
    assert not issubclass(outer.error, Exception) and outer.error is not TimeLimitExceeded
