"""`time_limit`: stop a call that runs too long, in whichever thread it runs.

Reward functions run in the main thread (a synchronous run), in a sampling thread
(`run.max_staleness` >= 1) or in a thread of a rollout process. `signal.alarm`, the
usual way to bound a call (math-verify's own), works in the main thread only; this
works in any: when the time is up, one watchdog thread (per process) raises an
exception in the thread that entered the block (`PyThreadState_SetAsyncExc`, the way
the interpreter delivers an exception to another thread). Like a signal handler it
acts between two bytecodes: Python code (a parser, a symbolic comparison) stops at
once, while a call blocked in C (a sleep, a socket read without its own timeout)
stops when it returns to Python.

Each block raises its own subclass of `TimeLimitExceeded` (`limit.error`), once, so
nested limits never catch each other's; it is a BaseException, so a reward's
`except Exception` does not swallow it (a bare `except:` can, and the block then runs
on). A thread holds one pending exception at a time, so the watchdog raises in a
thread only once the last one it raised there has been delivered, outermost block
first; a pending one whose block has ended is dropped. Such an exception can land
anywhere in the thread, this module's own bookkeeping included, cutting a block's
exit short: so the bookkeeping holds only a C lock (which a `with` statement
releases whatever lands), a delivered error (it notes its delivery when the
interpreter makes it) closes its block and every block opened inside it, which it
unwinds, and a block whose function has returned is never raised in. A thread being
started shares for a moment the identity of the thread starting it and would receive
the exception instead: the watchdog raises while no thread is being started, and
tries again shortly after.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import sys
import threading
import time
from types import FrameType

__all__ = ["TimeLimitExceeded", "time_limit"]

RETRY_SECONDS = 0.001  # a thread being started: how soon the watchdog tries again
STARTING_PATIENCE = 0.1  # how long past a deadline it waits for threads being started


class TimeLimitExceeded(BaseException):
    """A `time_limit` block ran past its seconds."""

    block: time_limit | None = None  # set on each block's own subclass

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        if self.block is not None:  # made by the interpreter in the block's thread: delivered
            _WATCHDOG.delivered(self.block)


class time_limit:  # noqa: N801 - used as a context manager, like a function
    """`with time_limit(seconds) as limit:` raises `limit.error` in this thread once `seconds`
    have passed inside the block; None = no limit."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.error = type("TimeLimitExceeded", (TimeLimitExceeded,), {"block": self})
        self.fired = self.closed = False
        self.frame: FrameType | None = None

    def __enter__(self) -> time_limit:
        if self.seconds is not None:
            self.thread = threading.get_ident()
            self.frame = sys._getframe(1)  # the function running the block
            self.deadline = time.monotonic() + self.seconds
            _WATCHDOG.open(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.seconds is not None:
            _WATCHDOG.close(self)


class _Watchdog:
    """The one thread that raises each open block's error at its deadline."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked child has no watchdog thread
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # a C lock, so `with` releases it whatever is raised; reentrant, as a delivery may
        # land in this module's own bookkeeping and note itself there
        self._lock = threading.RLock()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()  # put: one C call
        self._open: dict[int, list[time_limit]] = {}  # thread -> its blocks, outermost first
        self._pending: dict[int, time_limit] = {}  # thread -> block raised there, not delivered
        self._thread: threading.Thread | None = None

    def open(self, limit: time_limit) -> None:
        start = None
        with self._lock:
            self._open.setdefault(limit.thread, []).append(limit)
            if self._thread is None:
                start = self._thread = threading.Thread(target=self._run, daemon=True)
        if start is not None:
            start.start()
        self._wake.put(None)

    def close(self, limit: time_limit) -> None:
        """Close `limit`'s block as it ends, and every block opened inside it; drop an error
        raised for one of them and not yet delivered."""
        with self._lock:
            closing = self._close_from(limit)
            if any(self._pending.get(limit.thread) is block for block in closing):
                _raise_in(limit.thread, None)
                del self._pending[limit.thread]

    def delivered(self, limit: time_limit) -> None:
        """`limit`'s error is raised in its thread: it unwinds the block and every block
        opened inside it, whose exits it may cut short, so they are closed here."""
        with self._lock:
            if self._pending.get(limit.thread) is limit:
                del self._pending[limit.thread]
            self._close_from(limit)
            self._wake.put(None)  # the thread's enclosing blocks may be raised in again

    def _close_from(self, limit: time_limit) -> list[time_limit]:
        """Close `limit` and the blocks above it in its thread's stack; returns them."""
        blocks = self._open.get(limit.thread, [])
        depth = next((i for i, block in enumerate(blocks) if block is limit), len(blocks))
        closing = [limit, *blocks[depth:]]
        for block in closing:
            block.closed, block.frame = True, None
        del blocks[depth:]
        if not blocks:
            self._open.pop(limit.thread, None)
        return closing

    def _run(self) -> None:
        while True:
            with self._lock:
                wait = self._raise_due()
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=wait)

    def _raise_due(self) -> float:
        """Raise every block past its deadline; returns the seconds until the next one."""
        now, frames, soonest = time.monotonic(), None, 60.0
        for thread, blocks in list(self._open.items()):
            for block in blocks:  # outermost first
                due = block.deadline <= now and not block.fired and not block.closed
                if due and thread not in self._pending:  # one pending exception per thread
                    frames = sys._current_frames() if frames is None else frames
                    if _running(frames.get(thread), block.frame):
                        self._fire(block, now)
                    else:  # its function has returned: its exit was cut short
                        block.closed, block.frame = True, None
                if not (block.fired or block.closed):
                    soonest = min(soonest, block.deadline - now)
            blocks[:] = [block for block in blocks if not block.closed]
            if not blocks:
                del self._open[thread]
        return max(soonest, 0.0)

    def _fire(self, block: time_limit, now: float) -> None:
        """Raise the block's error in its thread, or try again shortly (a thread is starting)."""
        patient = now < block.deadline + STARTING_PATIENCE
        with _STARTING_LOCK:  # holding it, no thread of `threading` is being started
            if not (patient and getattr(threading, "_limbo", None)):
                raised = _raise_in(block.thread, block.error)
                if raised <= 1:  # 0: the thread has ended
                    block.fired = True
                    if raised:
                        self._pending[block.thread] = block
                    return
                _raise_in(block.thread, None)  # set in two threads: undo (CPython's advice)
        block.deadline = now + RETRY_SECONDS - (0.0 if patient else STARTING_PATIENCE)


def _running(frame: FrameType | None, target: FrameType | None) -> bool:
    """Whether `target` is `frame` or one of its callers."""
    while frame is not None and frame is not target:
        frame = frame.f_back
    return frame is not None


def _raise_in(thread_id: int, error: type[BaseException] | None) -> int:
    """Have thread `thread_id` raise `error` at its next bytecode (None: drop a pending one);
    returns how many thread states were set."""
    exception = None if error is None else ctypes.py_object(error)
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exception)


_STARTING_LOCK = getattr(threading, "_active_limbo_lock", None) or contextlib.nullcontext()
_WATCHDOG = _Watchdog()
