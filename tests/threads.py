"""Running a test's work in the main thread or in another one (rewards run in both)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def run_in_thread(work: Callable[[], Any], in_thread: bool = True, timeout: float = 120.0) -> Any:
    """`work()`'s value, run in a new thread when `in_thread` (else here); what it raised there
    is raised here, and a thread still running after `timeout` seconds fails the test."""
    if not in_thread:
        return work()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = work()
        except BaseException as err:  # handed back to the test's thread
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=timeout)
    assert not thread.is_alive(), f"the work did not end within {timeout} s"
    if "error" in out:
        raise out["error"]
    return out["value"]
