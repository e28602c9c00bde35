"""`time_limit`: stop a call that runs too long, in whichever thread it runs.

Reward functions run in the main thread (a synchronous run), in a sampling thread
(`run.max_staleness` >= 1) or in a thread of a rollout process. `signal.alarm`, the
usual way to bound a call (math-verify's own), works in the main thread only; this
works in any: when the time is up, a timer thread raises an exception in the thread
that entered the block (`PyThreadState_SetAsyncExc`, the way the interpreter delivers
an exception to another thread). Like a signal handler it acts between two bytecodes:
Python code (a parser, a symbolic comparison) stops at once, while a call blocked in C
(a sleep, a socket read without its own timeout) stops when it returns to Python.

Each block raises its own subclass of `TimeLimitExceeded` (`limit.error`), so nested
limits never catch each other's; it is a BaseException, so a reward's
`except Exception` does not swallow it. The timer fires once.
"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["TimeLimitExceeded", "time_limit"]


class TimeLimitExceeded(BaseException):
    """A `time_limit` block ran past its seconds."""


class time_limit:  # noqa: N801 - used as a context manager, like a function
    """`with time_limit(seconds) as limit:` raises `limit.error` in this thread once `seconds`
    have passed inside the block; None = no limit."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.error = type("TimeLimitExceeded", (TimeLimitExceeded,), {"seconds": seconds})
        self._lock = threading.Lock()
        self._inside = False
        self._timer: threading.Timer | None = None

    def __enter__(self) -> time_limit:
        if self.seconds is not None:
            self._target = threading.get_ident()
            self._inside = True
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is None:
            return
        with self._lock:  # after this, the timer raises nothing
            self._inside = False
            _raise_in(self._target, None)  # fired as the block ended, not yet raised: dropped
        self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if self._inside:
                _raise_in(self._target, self.error)


def _raise_in(thread_id: int, error: type[BaseException] | None) -> None:
    """Have thread `thread_id` raise `error` at its next bytecode (None: cancel a pending one)."""
    exception = None if error is None else ctypes.py_object(error)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exception)
