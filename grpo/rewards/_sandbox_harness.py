"""Child side of `grpo.rewards.sandbox`: run untrusted code against tests, then report.

Run as ``python -I -B _sandbox_harness.py`` with a JSON job on stdin. Before any
untrusted code runs it sets resource limits, moves into the job's working
directory and installs an audit hook (PEP 578) that refuses: creating
processes (fork, exec, spawn, subprocess, os.system), signalling other
processes, sockets and name look-ups, writes, deletions, renames and
permission changes outside the working directory, raising resource limits,
loading native code through ctypes, and heap introspection through gc.
A refused event ends the process at once with exit code `REFUSED_EXIT`, after
recording the event in the result file, so user code cannot catch and ignore it.

Audit hooks are not a security boundary against code written to escape them
(PEP 578 says so); they stop the accidents and shortcuts of model-written code.
The parent adds a wall-clock limit with a process-group kill and, where the
kernel allows it, a network namespace without interfaces.

Imports only the standard library: it must not import `grpo` (isolated mode).
"""

import contextlib
import io
import json
import os
import resource
import signal
import sys
import traceback

REFUSED_EXIT = 86
MEMORY_EXIT = 87
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PROCESS_EVENTS = frozenset(
    {
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn",
    }
)  # fmt: skip
_NETWORK_EVENTS = frozenset(
    {"socket.__new__", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
     "socket.gethostbyaddr", "socket.connect", "socket.bind", "urllib.Request"}
)  # fmt: skip
_OTHER_EVENTS = frozenset(
    {"resource.setrlimit", "resource.prlimit", "sys.addaudithook", "ctypes.dlopen",
     "ctypes.dlsym", "gc.get_objects", "gc.get_referrers", "gc.get_referents"}
)  # fmt: skip
_BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess"})
# Events whose listed argument positions are paths that get modified.
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
    "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,),
    "os.chown": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
    "os.lchmod": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
    "shutil.copyfile": (1,), "shutil.copymode": (1,), "shutil.copystat": (1,),
    "shutil.chown": (0,), "shutil.move": (1,), "shutil.copytree": (1,),
}  # fmt: skip


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


def _install_hook(workdir, result_file):
    root = os.path.realpath(workdir)
    state = {"busy": False}

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor; opening it was checked
        real = os.path.realpath(os.fsdecode(os.fspath(path)))
        return real == root or real.startswith(root + os.sep) or real == os.devnull

    def refuse(event, args):
        state["busy"] = True  # the checks below may raise events of their own
        with contextlib.suppress(Exception):
            name = f"import {args[0]}" if event == "import" else event
            result_file.write(json.dumps({"refused": name, "detail": repr(args)[:200]}))
            result_file.flush()
        os._exit(REFUSED_EXIT)

    def hook(event, args):
        if state["busy"]:
            return
        if event in _PROCESS_EVENTS or event in _NETWORK_EVENTS or event in _OTHER_EVENTS:
            refuse(event, args)
        if event == "import" and args[0] in _BLOCKED_IMPORTS:
            refuse(event, args)
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and path is not None:
                state["busy"] = True
                try:
                    ok = inside(path)
                finally:
                    state["busy"] = False
                if not ok:
                    refuse(event, args)
        positions = _PATH_EVENTS.get(event)
        if positions:
            state["busy"] = True
            try:
                ok = all(args[p] is None or inside(args[p]) for p in positions if p < len(args))
            finally:
                state["busy"] = False
            if not ok:
                refuse(event, args)

    sys.addaudithook(hook)


def _run_asserts(code, tests):
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
    except MemoryError:
        raise
    except BaseException as error:  # noqa: BLE001 - the solution's own failure, reported
        return 0, len(tests), "error", _describe(error)
    passed = 0
    for test in tests:
        try:
            exec(compile(test, "<test>", "exec"), namespace)
            passed += 1
        except MemoryError:
            raise
        except BaseException:  # noqa: BLE001, S110 - a failing test is a normal outcome
            pass
    return passed, len(tests) - passed, "ok", ""


def _run_io(code, pairs):
    try:
        compiled = compile(code, "<solution>", "exec")
    except (SyntaxError, ValueError) as error:
        return 0, len(pairs), "error", _describe(error)
    passed = 0
    for stdin_text, expected in pairs:
        out = io.StringIO()
        sys.stdin = io.StringIO(stdin_text)
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
            continue
        if _normalise(out.getvalue()) == _normalise(expected):
            passed += 1
    return passed, len(pairs) - passed, "ok", ""


def _normalise(text):
    return "\n".join(line.rstrip() for line in str(text).strip().splitlines())


def _describe(error):
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip()[-500:]


def main():
    job = json.loads(sys.stdin.read())
    sys.stdin = io.StringIO("")
    # Opened before the hook: the one write outside the working directory.
    result_file = open(job["result_path"], "w")  # noqa: SIM115 - kept open until os._exit
    _set_limits(job)
    os.chdir(job["workdir"])
    sys.dont_write_bytecode = True
    _install_hook(job["workdir"], result_file)
    try:
        if job["kind"] == "asserts":
            passed, failed, reason, detail = _run_asserts(job["code"], job["tests"])
        else:
            passed, failed, reason, detail = _run_io(job["code"], job["tests"])
    except MemoryError:
        result_file.write(json.dumps({"memory": True}))
        result_file.flush()
        os._exit(MEMORY_EXIT)
    result = {"passed": passed, "failed": failed, "reason": reason, "detail": detail}
    result_file.write(json.dumps(result))
    result_file.flush()
    os._exit(0)  # skip atexit handlers and finalisers the solution may have registered


if __name__ == "__main__":
    main()
