"""Code-execution reward: run model-written Python against tests, in a separate process.

Each submission runs in a fresh ``python -I -B`` process (isolated mode: no user
site-packages, no environment variables of Python's, no bytecode written),
started in its own session so that the whole process group can be killed,
inside a new temporary working directory that is deleted afterwards. The
child (`grpo/rewards/_sandbox_harness.py`) limits itself before running the
code: address space (RLIMIT_AS), CPU time and file size, and an audit hook
(PEP 578) refuses process creation, signals to other processes, sockets and
writes outside the working directory. The parent enforces a wall-clock limit
and kills the process group when it runs out, and when the child exits (in
case anything escaped). Where the kernel allows it (``unshare -n`` works, e.g.
as root on Linux), the child also runs in a network namespace with no
interfaces.

Why not RLIMIT_NPROC against fork bombs: it counts processes per user and is
not enforced for root (verified: as root a child with RLIMIT_NPROC=3 forked
20 times), so the audit hook refuses the fork itself.

Scoring: reward = passed / total tests. A timeout, a memory blow-up, a refused
operation or a crash scores 0, and the caller gets a `SandboxResult` saying
which; training carries on. This is a guard against accidents and reward
hacks of model-written code, not against code crafted to break out of a
CPython process: for that, run the trainer itself inside a container.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo.rewards.parsers import completion_text

__all__ = [
    "SandboxConfig",
    "SandboxResult",
    "code_execution_reward",
    "extract_code",
    "network_namespace_available",
    "run_code",
]

_HARNESS = Path(__file__).with_name("_sandbox_harness.py")
_REFUSED_EXIT, _MEMORY_EXIT = 86, 87  # must match _sandbox_harness.py
REASONS = ("ok", "error", "timeout", "memory", "refused", "crashed", "no_tests")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed run."""

    timeout_seconds: float = 5.0
    """Wall-clock limit of the whole run (all tests); the process group is killed after it."""
    memory_mb: int = 512
    """Address-space limit of the child process (RLIMIT_AS), in MiB."""
    max_file_mb: int = 16
    """Largest file the child may write (RLIMIT_FSIZE), its captured output included."""
    isolate_network: bool = True
    """Also run in an empty network namespace (``unshare -n``) when the system allows it."""

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout_seconds, (int, float)) and self.timeout_seconds > 0):
            raise ValueError(f"timeout_seconds must be > 0, got {self.timeout_seconds!r}")
        for name in ("memory_mb", "max_file_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(
                f"memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}"
            )


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one submission."""

    passed: int
    """Tests passed."""
    failed: int
    """Tests failed (all of them when the run was stopped)."""
    reason: str
    """One of REASONS: "ok", "error" (the code raised), "timeout", "memory", "refused", "crashed", "no_tests"."""
    detail: str = ""
    """The refused event, the error message or the exit status."""

    @property
    def total(self) -> int:
        return self.passed + self.failed

    @property
    def score(self) -> float:
        """passed / total for a run that finished, 0.0 for a stopped one."""
        if self.reason not in ("ok", "error") or self.total == 0:
            return 0.0
        return self.passed / self.total


@lru_cache(maxsize=1)
def _unshare_command() -> str | None:
    """Absolute path of ``unshare`` when ``unshare -n`` works here (needs privileges), else None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    try:
        probe = subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return unshare if probe.returncode == 0 else None


def network_namespace_available() -> bool:
    """Whether children can run in an empty network namespace (``unshare -n``; probed once)."""
    return _unshare_command() is not None


def run_code(
    code: str,
    *,
    asserts: Sequence[str] | None = None,
    io_pairs: Sequence[tuple[str, str]] | None = None,
    config: SandboxConfig | None = None,
) -> SandboxResult:
    """Run `code`, then either `asserts` (statements run after it) or `io_pairs` (stdin, stdout)."""
    config = config or SandboxConfig()
    if (asserts is None) == (io_pairs is None):
        raise ValueError(
            "pass exactly one of asserts (statements) or io_pairs ((stdin, stdout) pairs)"
        )
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    kind, tests = (
        ("asserts", [str(t) for t in asserts]) if asserts is not None else ("io", _pairs(io_pairs))
    )
    if not tests:
        return SandboxResult(0, 0, "no_tests")
    with tempfile.TemporaryDirectory(prefix="grpo-sandbox-") as private:
        workdir = Path(private) / "work"  # the child's directory; its results live beside it
        workdir.mkdir()
        result_path = Path(private) / "result.json"
        job = {
            "code": code,
            "tests": tests,
            "kind": kind,
            "workdir": str(workdir),
            "result_path": str(result_path),
            "memory_bytes": config.memory_mb * 2**20,
            "cpu_seconds": math.ceil(config.timeout_seconds) + 1,
            "max_file_bytes": config.max_file_mb * 2**20,
        }
        status = _spawn(job, workdir, Path(private), config)
        return _read_result(status, result_path, len(tests))


def _pairs(io_pairs: Sequence[Any]) -> list[list[str]]:
    pairs = []
    for index, pair in enumerate(io_pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(
                f"io_pairs[{index}] must be a (stdin, expected stdout) pair, got {pair!r}"
            )
        pairs.append([str(pair[0]), str(pair[1])])
    return pairs


def _spawn(job: dict[str, Any], workdir: Path, private: Path, config: SandboxConfig) -> int | None:
    """Run the harness; its exit status, or None when it ran out of time."""
    command = [sys.executable, "-I", "-B", str(_HARNESS)]
    unshare = _unshare_command() if config.isolate_network else None
    if unshare is not None:
        command = [unshare, "-n", "--", *command]
    env = {"PATH": os.defpath, "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
    with open(private / "stdout", "wb") as out, open(private / "stderr", "wb") as err:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=workdir, env=env,
            start_new_session=True,  # its own process group: one killpg reaches every descendant
        )  # fmt: skip
        try:
            process.communicate(json.dumps(job).encode(), timeout=config.timeout_seconds)
            status: int | None = process.returncode
        except subprocess.TimeoutExpired:
            status = None
        finally:
            _kill_group(process.pid)
            process.wait()
    return status


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group may be gone
        os.killpg(pid, signal.SIGKILL)


def _read_result(status: int | None, result_path: Path, num_tests: int) -> SandboxResult:
    if status is None:
        return SandboxResult(0, num_tests, "timeout", "wall-clock limit reached")
    try:
        report = json.loads(result_path.read_text())
    except (OSError, ValueError):
        report = {}
    if status == _REFUSED_EXIT and "refused" in report:
        return SandboxResult(0, num_tests, "refused", str(report["refused"]))
    if status == _MEMORY_EXIT:
        return SandboxResult(0, num_tests, "memory", "MemoryError under the address-space limit")
    if status != 0 or "passed" not in report:
        signal_name = signal.Signals(-status).name if status < 0 else f"exit status {status}"
        return SandboxResult(0, num_tests, "crashed", signal_name)
    passed = int(report["passed"])
    return SandboxResult(passed, num_tests - passed, str(report["reason"]), str(report["detail"]))


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of `text` (```python ... ```), or the whole text if none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def code_execution_reward(
    config: SandboxConfig | None = None,
    *,
    extract: Callable[[str], str] = extract_code,
    max_workers: int = 1,
) -> Callable[..., list[float | None]]:
    """A text reward running each completion's code against its row's `tests` or `io_pairs`.

    The dataset column `tests` holds assert statements, `io_pairs` (stdin,
    stdout) pairs; a row with neither gets None (the reward does not apply).
    `max_workers` sandboxes run at once (threads that each wait on a process).
    """
    config = config or SandboxConfig()
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers must be a positive integer, got {max_workers!r}")

    def score_row(index: int, completion: Any, row_tests: Any, row_pairs: Any) -> float | None:
        if not row_tests and not row_pairs:
            return None
        code = extract(completion_text(completion, index))
        if row_tests:
            return run_code(code, asserts=row_tests, config=config).score
        return run_code(code, io_pairs=row_pairs, config=config).score

    def code_execution(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        tests: Sequence[Sequence[str] | None] | None = None,
        io_pairs: Sequence[Sequence[tuple[str, str]] | None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        rows = [
            (
                i,
                c,
                tests[i] if tests is not None else None,
                io_pairs[i] if io_pairs is not None else None,
            )
            for i, c in enumerate(completions)
        ]
        if max_workers == 1:
            return [score_row(*row) for row in rows]
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            return list(pool.map(lambda row: score_row(*row), rows))

    return code_execution
