"""Child side of `grpo.rewards.sandbox`: limit this process, then run untrusted code against tests.

Run as ``python -I -B _sandbox_harness.py`` with a JSON job on stdin. Before any
untrusted code runs it opens the report descriptor, sets resource limits
(address space, CPU time, file size), moves into the job's working directory
and installs the audit hook of `_sandbox_guard.py`. Then:

- assert tests: `_sandbox_asserts.py` runs the solution and each value the
  tests need on worker threads, and writes the values, signed with the job's
  nonce, from the main thread that no submitted code runs on;
- stdin/stdout pairs: each case runs the program afresh on this thread with the
  case's stdin, and the report lists what each case printed (None for a case
  that raised or exited with a non-zero status). The expected outputs never
  reach this process: the parent compares, so nothing written here can pass a
  case without printing its expected output.

Imports only the standard library: it must not import `grpo` (isolated mode), so
it loads its two siblings from this file's directory.
"""

import contextlib
import io
import json
import os
import resource
import signal
import sys
import traceback

MEMORY_EXIT = 87  # must match _sandbox_asserts.MEMORY_EXIT and sandbox.py


def _set_limits(job):
    memory = int(job["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(job["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    size = int(job["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes fail with EFBIG, no kill
    signal.alarm(cpu + 1)  # outlives no parent: SIGALRM's default action ends the process


def _load_siblings():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import _sandbox_asserts
        import _sandbox_guard
    finally:
        sys.path.remove(here)
    for name in ("_sandbox_asserts", "_sandbox_guard"):
        del sys.modules[name]  # nothing for the submitted code to find by name
    return _sandbox_guard, _sandbox_asserts


def _run_io(code, inputs):
    """What the program printed for each stdin (None where it failed), or an error description."""
    try:
        compiled = compile(code, "<solution>", "exec")
    except (SyntaxError, ValueError) as error:
        return {
            "error": "".join(traceback.format_exception_only(type(error), error)).strip()[-500:]
        }
    outputs = []
    for stdin_text in inputs:
        # Text streams over bytes, as a real process has: `sys.stdin.buffer.readline` and
        # `sys.stdout.buffer.write`, the competitive-programming idioms, work too.
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_text.encode()), encoding="utf-8")
        try:
            with contextlib.redirect_stdout(out):
                try:
                    exec(compiled, {"__name__": "__main__"})
                except SystemExit as stop:
                    if stop.code not in (None, 0):
                        raise
        except MemoryError:
            raise
        except BaseException:  # noqa: BLE001 - a crashing case is a failed case
            outputs.append(None)
            continue
        out.flush()
        outputs.append(out.buffer.getvalue().decode("utf-8", errors="replace"))
    return {"outputs": outputs}


def main():
    job = json.loads(sys.stdin.read())
    sys.stdin = io.StringIO("")
    # Opened before the hook: the one write outside the working directory.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    report_fd = os.open(job["report_path"], flags, 0o600)
    _set_limits(job)
    os.chdir(job["workdir"])
    sys.dont_write_bytecode = True
    guard, asserts = _load_siblings()

    def install_hook(trusted_thread=None):
        guard.install(job["workdir"], report_fd, trusted_thread)

    if job["kind"] == "asserts":
        asserts.run(job, report_fd, install_hook)  # exits
    install_hook()
    try:
        report = _run_io(job["code"], job["inputs"])
    except MemoryError:
        os._exit(MEMORY_EXIT)
    os.pwrite(report_fd, json.dumps(report).encode(), 0)
    os._exit(0)  # skip atexit handlers and finalisers the program may have registered


if __name__ == "__main__":
    main()
