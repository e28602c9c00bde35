"""Child side of `grpo.rewards.sandbox`: the audit hook (PEP 578) that refuses what submitted code may not do.

`install` runs before any submitted code. The hook refuses: creating processes
(fork, exec, spawn, subprocess, os.system), signalling processes, sockets and
name look-ups, raising resource limits, loading native code (ctypes, cffi), building
code objects by hand, heap and thread-stack introspection (gc.get_objects,
sys._current_frames), tracing (sys.settrace, sys.setprofile), reading process
memory (/proc/<pid>/mem, /dev/mem), and writes, deletions, renames and
permission changes outside the working directory. With `trusted_thread` set
(assert tests: the solution runs in worker threads, see `_sandbox_asserts.py`)
it also refuses new threads, and refuses every event raised on the trusted
thread beyond the few the harness itself raises: code that ends up running
there (a finaliser, a gc callback) can neither look at the harness's frames nor
do anything else that is audited.

A refused event ends the process at once with exit status `REFUSED_EXIT`, after
writing the event's name to the report descriptor, so user code cannot catch it.

Every name the hook uses is bound when `install` runs: submitted code can rebind
module attributes and builtins (os.path.realpath, builtins.isinstance, ...) but
not these closure cells. The hook never calls a method the submitted code could
override: it takes paths only as exact str/bytes/int, resolves symbolic links
itself with os.lstat/os.readlink, and refuses path-like objects in events that
modify files rather than call their __fspath__.

Audit hooks are not a security boundary against code written to escape CPython
(PEP 578 says so); they stop the accidents and shortcuts of model-written code.
"""

import _json
import _thread
import os
import stat
import sys

REFUSED_EXIT = 86
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_ALWAYS_REFUSED = frozenset(
    {
        # processes and signals
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn",
        # network
        "socket.__new__", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
        "socket.gethostbyaddr", "socket.connect", "socket.bind", "urllib.Request",
        # limits, hooks, native code, hand-made bytecode
        "resource.setrlimit", "resource.prlimit", "sys.addaudithook", "ctypes.dlopen",
        "ctypes.dlsym", "code.__new__",
        # reaching other threads' frames or the whole heap
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
        "sys.settrace", "sys.setprofile",
    }
)  # fmt: skip
# ctypes and cffi read and write raw memory (the harness's nonce included).
_BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "_cffi_backend", "cffi", "_posixsubprocess"})
# The harness's own events on the trusted thread (starting a worker).
_TRUSTED_EVENTS = frozenset({"_thread.start_new_thread"})
# event -> ((position of a path that gets modified, position of its dir_fd or None), ...)
_PATH_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
    "os.truncate": ((0, None),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
    "os.utime": ((0, 3),), "os.chflags": ((0, None),), "os.lchflags": ((0, None),),
    "os.lchmod": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.copymode": ((1, None),),
    "shutil.copystat": ((1, None),), "shutil.chown": ((0, None),), "shutil.move": ((1, None),),
    "shutil.copytree": ((1, None),),
}  # fmt: skip
_MEMORY_DEVICES = frozenset({"/dev/mem", "/dev/kmem", "/dev/port"})


def install(workdir, report_fd, trusted_thread=None):
    """Add the hook; `trusted_thread` is the ident of the thread that runs no submitted code."""
    sys.addaudithook(_make_hook(os.path.realpath(workdir), report_fd, trusted_thread))


def _make_hook(
    root,
    report_fd,
    trusted_thread,
    *,
    # Bound now: submitted code may rebind the module attributes and builtins later.
    len=len, get_ident=_thread.get_ident, pwrite=os.pwrite, exit=os._exit,
    quote=_json.encode_basestring_ascii, always_refused=_ALWAYS_REFUSED,
    blocked_imports=_BLOCKED_IMPORTS, trusted_events=_TRUSTED_EVENTS, path_events=_PATH_EVENTS,
):  # fmt: skip
    """The audit hook: refuses (report, then exit) what the sandbox forbids."""
    text, check_open, check_paths = _make_path_checks(root)

    def refuse(name):
        note = '{"refused": ' + quote(name) + "}\n"
        try:
            pwrite(report_fd, note.encode(), 0)
        finally:
            exit(REFUSED_EXIT)

    def hook(event, args):
        if trusted_thread is not None and get_ident() == trusted_thread:
            if event not in trusted_events:
                refuse(event)
            return
        if event in always_refused:
            refuse(event)
        if event == "_thread.start_new_thread" and trusted_thread is not None:
            refuse(event)
        if event == "import" and len(args) > 0 and text(args[0]) in blocked_imports:
            refuse("import " + text(args[0]))
        if event == "open" and len(args) == 3 and not check_open(args):
            refuse(event)
        if event in path_events and not check_paths(event, args):
            refuse(event)

    return hook


def _make_path_checks(
    root,
    *,
    type=type, issubclass=issubclass, len=len, str=str, bytes=bytes, int=int, OSError=OSError,
    getcwd=os.getcwd, readlink=os.readlink, path_events=_PATH_EVENTS,
    memory_devices=_MEMORY_DEVICES, write_flags=_WRITE_FLAGS,
):  # fmt: skip
    """(text, check_open, check_paths): a path argument read exactly, and whether an `open`
    or a path event stays allowed (writes only below `root`, no process memory)."""
    refused_path = object()  # a path we cannot check without calling submitted code
    resolve, inside = _make_resolver(root)

    def text(value):
        """An exact str for a path argument, None for None or a descriptor, else `refused_path`."""
        kind = type(value)
        if kind is str:
            return value
        if kind is int or value is None:
            return None
        if issubclass(kind, str):
            return str.__str__(value)  # the stored characters, not an overridden __str__
        if issubclass(kind, bytes):
            return bytes.decode(value, "utf-8", "surrogateescape")
        return refused_path

    def dir_base(dir_fd):
        """The directory a dir_fd argument points at, or the working directory for none."""
        if type(dir_fd) is not int or dir_fd < 0:
            return getcwd()
        try:
            return readlink("/proc/self/fd/" + str(dir_fd))
        except OSError:
            return None

    def check_open(args):
        path, mode, flags = args
        path = text(path)
        if path is None:
            return True  # an already-open descriptor; opening it was checked
        if path is refused_path:
            return False
        real = resolve(path, getcwd())
        if real is None or real in memory_devices:
            return False
        parts = real.split("/")
        if len(parts) > 2 and parts[1] == "proc" and parts[-1] == "mem":
            return False  # another process's memory, or this one's
        writes = (
            type(mode) is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
        ) or (type(flags) is int and flags & write_flags)
        if not writes or real == "/dev/null":
            return True
        if mode is None and path[:1] != "/":
            return False  # os.open with a relative path: its dir_fd is not in the event
        return inside(path, getcwd())

    def check_paths(event, args):
        for path_at, dir_fd_at in path_events[event]:
            if path_at >= len(args):
                continue
            path = text(args[path_at])
            if path is None:
                continue
            if path is refused_path:
                return False
            base = dir_base(
                args[dir_fd_at] if dir_fd_at is not None and dir_fd_at < len(args) else None
            )
            if base is None or not inside(path, base):
                return False
        return True

    return text, check_open, check_paths


def _make_resolver(
    root, *, len=len, OSError=OSError, ValueError=ValueError, lstat=os.lstat,
    readlink=os.readlink, is_link=stat.S_ISLNK,
):  # fmt: skip
    """(resolve, inside): symbolic links followed by hand, and containment in `root`."""

    def resolve(path, base):
        """Absolute `path` with every symbolic link followed, like os.path.realpath; None on a loop."""
        if path[:1] != "/":
            path = base + "/" + path
        pending = path.split("/")[::-1]
        resolved, hops = "", 0
        while pending:
            name = pending.pop()
            if name == "" or name == ".":
                continue
            if name == "..":
                resolved = resolved[: resolved.rfind("/")] if resolved else ""
                continue
            candidate = resolved + "/" + name
            try:
                link = is_link(lstat(candidate).st_mode)
            except (OSError, ValueError):
                link = False  # missing (about to be created) or not a directory: taken as written
            if not link:
                resolved = candidate
                continue
            hops += 1
            if hops > 40:
                return None
            target = readlink(candidate)
            if target[:1] == "/":
                resolved = ""
            pending.extend(target.split("/")[::-1])
        return resolved or "/"

    def inside(path, base):
        real = resolve(path, base)
        return real is not None and (real == root or real[: len(root) + 1] == root + "/")

    return resolve, inside
