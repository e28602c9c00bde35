"""Tests for grpo.rewards.time_limit: a block stopped after its seconds, in any thread."""

from __future__ import annotations

import contextlib
import random
import threading
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
    """Ended before its limit, a block raises nothing then or later and the watchdog holds
    nothing of it; a block without a limit (None) never reaches the watchdog at all."""
    from grpo.rewards.time_limit import _WATCHDOG

    with time_limit(0.2):
        spin(0.01)
        assert threading.get_ident() in _WATCHDOG._open  # watched while it runs
    spin(0.5)  # well past the limit: a stray exception would be raised here
    here = threading.get_ident()
    assert here not in _WATCHDOG._open and here not in _WATCHDOG._pending
    with time_limit(None) as limit:  # None: no limit, no timer
        assert here not in _WATCHDOG._open
        spin(0.05)
    assert issubclass(limit.error, TimeLimitExceeded) and not limit.fired


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


def test_threads_started_inside_a_block_as_it_runs_out_are_left_alone():
    """A block starting threads while its time runs out raises its own error, in its thread
    only, and ends: every thread it started ran (a thread being started shares its starter's
    identity for a moment, and must not receive the error)."""
    ran, threads = [], []

    def block():
        limit = time_limit(0.2)
        try:
            with limit:
                while True:
                    threads.append(threading.Thread(target=lambda: ran.append(1)))
                    threads[-1].start()
        except limit.error:
            return True

    assert run_in_thread(block, timeout=60.0)
    started = [thread for thread in threads if thread.ident is not None]
    for thread in started:
        thread.join(timeout=10)
    assert len(started) > 10 and len(ran) == len(started)


def test_nested_blocks_in_several_threads_raise_each_error_where_it_belongs():
    """Four threads, each running 30 outer blocks (0.03 s) of inner blocks (2 ms, 5 ms or
    10 s) over work of 0.5-4 ms, some starting threads: every outer block raises its own
    error, an inner error is only ever caught by its own block, nothing is raised after a
    block, and the watchdog holds no block once all have ended. An outer block's work runs
    until its error or for 2 s, so a watchdog slowed by a busy machine (it may wait 0.1 s
    past a deadline while threads start) still has the time to raise it."""
    from grpo.rewards.time_limit import _WATCHDOG

    def work(seed):
        rng, outer_raised = random.Random(seed), 0
        for _ in range(30):
            outer, give_up = time_limit(0.03), time.monotonic() + 2.0
            try:
                with outer:
                    while time.monotonic() < give_up:
                        inner = time_limit(rng.choice([0.002, 0.005, 10.0]))
                        with contextlib.suppress(inner.error), inner:
                            spin(rng.choice([0.0005, 0.001, 0.004]))
                        if rng.random() < 0.05:
                            threading.Thread(target=lambda: None).start()
            except outer.error:
                outer_raised += 1
            spin(0.005)  # after the block: a stray error would be raised here
        return outer_raised

    results = []
    threads = [threading.Thread(target=lambda s=s: results.append(work(s))) for s in range(3)]
    for thread in threads:
        thread.start()
    results.append(work(99))
    for thread in threads:
        thread.join(timeout=60)
    assert results == [30, 30, 30, 30]
    assert _WATCHDOG._open == {} and _WATCHDOG._pending == {}
