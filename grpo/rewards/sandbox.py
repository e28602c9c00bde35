"""Code-execution reward: run model-written Python against tests, in a separate process.

Each submission runs in a fresh ``python -I -B`` process (isolated mode: no user
site-packages, no environment variables of Python's, no bytecode written),
started in its own session so that the whole process group can be killed,
inside a new temporary working directory that is deleted afterwards. The
child (`_sandbox_harness.py`) limits itself before running the code: address
space (RLIMIT_AS), CPU time and file size; and an audit hook (PEP 578,
`_sandbox_guard.py`) refuses process creation, signals to processes, sockets,
native code, looking at other threads' frames or the whole heap, and writes
outside the working directory. The parent enforces a wall-clock limit and kills
the process group when it runs out, and when the child exits (in case anything
escaped). Where the kernel allows it (``unshare -n`` works, e.g. as root on
Linux), the child also runs in a network namespace with no interfaces.

Why not RLIMIT_NPROC against fork bombs: it counts processes per user and is
not enforced for root (verified: as root a child with RLIMIT_NPROC=3 forked
20 times), so the audit hook refuses the fork itself.

Verdicts are decided here, in the parent, from data the child cannot forge:

- stdin/stdout pairs: the child reports what the program printed for each
  case; the expected outputs never leave this process, the comparison runs here.
- assert tests (`_sandbox_checks.py`): for ``assert X == <literal>`` only X goes
  to the child and the literal stays here; ``assert X``, ``assert X < Y`` and
  the like go as the expressions to evaluate; anything else as a statement to
  run. The solution and each expression run on worker threads whose stacks hold
  no frame of the harness; the harness's own thread runs no submitted code,
  reads each value as plain data without calling any of its methods, and signs
  the report with a per-run nonce that only it and this process hold
  (`_sandbox_asserts.py`). The comparison runs here, on that plain data.

What that guarantees against a solution that tampers from inside the child
(patching json, sys, os, builtins or the harness's modules; walking frames,
tracebacks or the heap; objects whose ==, != or bool lie, subclasses of int,
str or list included; sys.exit or os._exit with status 0; finalisers, atexit
hooks, signal handlers; fake reports on stdout, stderr, files or descriptors;
stuffing queues it can reach):

- no test passes unless the harness saw its value computed: leaving early, or
  a report without the nonce's MAC, scores 0;
- ``assert X == <literal>`` and stdin/stdout cases pass only if the solution
  produces the expected value: it is never in the child, and the comparison is
  not the child's (a value that is not built-in data is equal to nothing).

What it does not guarantee:

- other forms (``assert all(...)``, ``assert f(x) == g(y)``, statements)
  evaluate in the child, where the solution may have rebound what they call
  (its own ``all``, a patched ``math.isclose``): write tests as
  ``assert f(args) == literal`` where you can;
- code written to break CPython itself (hand-made bytecode through marshal,
  interpreter memory bugs) can read the nonce out of its own process's memory:
  audit hooks are not a security boundary (PEP 578);
- reading files (the dataset, the trainer's files, other runs' reports),
  timing and CPU side channels, filling the machine's shared resources within
  the limits, and the kernel's attack surface: for those, run the trainer in a
  container or VM, as a separate user, with seccomp. `docs/sandbox.md` has the
  whole list.

Scoring: reward = passed / total tests. A timeout, a memory blow-up, a refused
operation or a crash scores 0, and the caller gets a `SandboxResult` saying
which; training carries on.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import os
import py_compile
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo.rewards._sandbox_checks import Check, decode, parse_check

__all__ = ["SandboxConfig", "SandboxResult", "network_namespace_available", "run_code"]

_HARNESS = Path(__file__).with_name("_sandbox_harness.py")
_REFUSED_EXIT, _MEMORY_EXIT = 86, 87  # must match _sandbox_guard.py and _sandbox_asserts.py
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
def _compile_child_modules() -> None:
    """Cache the bytecode of the child's modules: the child runs with -B (reads, never writes it)."""
    for name in ("_sandbox_guard.py", "_sandbox_asserts.py"):
        with contextlib.suppress(OSError, py_compile.PyCompileError):  # e.g. a read-only install
            py_compile.compile(str(_HARNESS.with_name(name)), doraise=True)


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
    for name, given in (("asserts", asserts), ("io_pairs", io_pairs)):
        if isinstance(given, (str, bytes)):  # a str is a Sequence: it would run char by char
            raise TypeError(f"{name} must be a list, got a {type(given).__name__}: {given[:60]!r}")
    if asserts is not None:
        checks = [parse_check(str(test)) for test in asserts]
        if not checks:
            return SandboxResult(0, 0, "no_tests")
        nonce = secrets.token_hex(32)  # the key of the report's MAC; see _sandbox_asserts.py
        job = {"kind": "asserts", "code": code, "steps": [c.steps for c in checks], "nonce": nonce}
    else:
        pairs = _pairs(io_pairs)
        if not pairs:
            return SandboxResult(0, 0, "no_tests")
        job = {"kind": "io", "code": code, "inputs": [stdin for stdin, _ in pairs]}
    with tempfile.TemporaryDirectory(prefix="grpo-sandbox-") as private:
        workdir = Path(private) / "work"  # the child's directory; its report lives beside it
        workdir.mkdir()
        report_path = Path(private) / "report"
        job |= {
            "workdir": str(workdir),
            "report_path": str(report_path),
            "memory_bytes": config.memory_mb * 2**20,
            "cpu_seconds": math.ceil(config.timeout_seconds) + 1,
            "max_file_bytes": config.max_file_mb * 2**20,
        }
        status = _spawn(job, workdir, Path(private), config)
        report = report_path.read_bytes() if report_path.exists() else b""
    stopped = _stopped(status, report, len(checks) if asserts is not None else len(pairs))
    if stopped is not None:
        return stopped
    if asserts is not None:
        return _judge_asserts(report, bytes.fromhex(nonce), checks)
    return _judge_io(report, [expected for _, expected in pairs])


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
    _compile_child_modules()
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


def _stopped(status: int | None, report: bytes, total: int) -> SandboxResult | None:
    """The result of a run that did not end normally (exit status 0), else None."""
    if status is None:
        return SandboxResult(0, total, "timeout", "wall-clock limit reached")
    if status == _REFUSED_EXIT:
        note = _first_json_line(report)
        return SandboxResult(0, total, "refused", str(note.get("refused", "")))
    if status == _MEMORY_EXIT:
        return SandboxResult(0, total, "memory", "MemoryError under the address-space limit")
    if status != 0:
        signal_name = _signal_name(-status) if status < 0 else f"exit status {status}"
        return SandboxResult(0, total, "crashed", signal_name)
    return None


def _signal_name(number: int) -> str:
    """SIGKILL and the like; real-time signals have no name in `signal.Signals`."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _first_json_line(report: bytes) -> dict[str, Any]:
    try:
        value = json.loads(report.split(b"\n", 1)[0])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _judge_asserts(report: bytes, key: bytes, checks: list[Check]) -> SandboxResult:
    """Verify the report's MAC, then decide every test here from the values the child reported."""
    total = len(checks)
    payload, _, rest = report.partition(b"\n")
    mac = hashlib.blake2b(payload, key=key, digest_size=32).hexdigest().encode()
    if not hmac.compare_digest(rest.split(b"\n", 1)[0], mac):
        return SandboxResult(0, total, "crashed", "exit status 0 without a signed report")
    data = json.loads(payload)
    if data["error"] is not None:
        return SandboxResult(0, total, "error", str(data["error"]))
    if len(data["tests"]) != total:
        return SandboxResult(0, total, "crashed", "a report for another job")
    passed = sum(
        _passes(check, values) for check, values in zip(checks, data["tests"], strict=True)
    )
    return SandboxResult(passed, total - passed, "ok", "")


def _passes(check: Check, encoded: list[Any]) -> bool:
    try:
        values = [decode(value) for value in encoded]
    except ValueError:
        return False
    return check.passes(values)


def _judge_io(report: bytes, expected: list[str]) -> SandboxResult:
    """Compare what the program printed for each case with the expected output, here."""
    total = len(expected)
    data = _first_json_line(report)
    if isinstance(data.get("error"), str):
        return SandboxResult(0, total, "error", data["error"])
    outputs = data.get("outputs")
    if not (isinstance(outputs, list) and len(outputs) == total):
        return SandboxResult(0, total, "crashed", "exit status 0 without a report")
    passed = sum(
        isinstance(out, str) and _normalise(out) == _normalise(want)
        for out, want in zip(outputs, expected, strict=True)
    )
    return SandboxResult(passed, total - passed, "ok", "")


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())
