"""Tests for grpo.rewards.sandbox: scoring, and every escape stopped or refused.

All hostile snippets are bounded (a fork "bomb" of at most 2**4 processes, 1 s
timeouts, a 256 MiB memory limit) so that a broken sandbox cannot harm the machine.
"""

import signal
import subprocess
import sys
import threading
import time

import pytest

from grpo.rewards.code_reward import code_execution_reward, extract_code
from grpo.rewards.sandbox import (
    SandboxConfig,
    SandboxResult,
    _kill_group,
    network_namespace_available,
    run_code,
)

CONFIG = SandboxConfig(timeout_seconds=1.0, memory_mb=256)
NO_NETNS = SandboxConfig(timeout_seconds=1.0, memory_mb=256, isolate_network=False)
ADD = "def add(a, b):\n    return a + b\n"


def test_fraction_of_asserts_passed():
    """Score = passed / total: 2 of 3 asserts hold."""
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
    result = run_code(ADD, asserts=tests, config=CONFIG)
    assert result == SandboxResult(2, 1, "ok", "")
    assert result.score == pytest.approx(2 / 3)


def test_io_pairs():
    """stdin/stdout pairs: each case runs the program afresh; output compared after stripping."""
    code = "n = int(input())\nprint(n * 2)\n"
    result = run_code(code, io_pairs=[("3\n", "6\n"), ("5", "10"), ("1", "3")], config=CONFIG)
    assert (result.passed, result.failed, result.reason) == (2, 1, "ok")


def test_io_pairs_through_byte_streams():
    """sys.stdin.buffer and sys.stdout.buffer work as in a real process, mixed with print."""
    code = (
        "import sys\nn = int(sys.stdin.buffer.readline())\n"
        "sys.stdout.buffer.write(str(n * 2).encode() + b'\\n')\nprint(n + 1)\n"
    )
    result = run_code(code, io_pairs=[("3\n", "6\n4"), ("5", "10\n6"), ("1", "3")], config=CONFIG)
    assert (result.passed, result.failed, result.reason) == (2, 1, "ok")


def test_code_that_raises_or_does_not_parse_scores_zero():
    """A syntax error or an exception at definition fails every test with reason 'error'."""
    assert run_code("def f(:\n", asserts=["assert True"], config=CONFIG).reason == "error"
    raised = run_code("raise RuntimeError('boom')", asserts=["assert True"], config=CONFIG)
    assert (raised.passed, raised.reason) == (0, "error") and "boom" in raised.detail


@pytest.mark.parametrize(
    "code, reason, detail",
    [
        ("while True:\n    pass", "timeout", None),
        ("import time\ntime.sleep(60)", "timeout", None),
        ("import os\nfor _ in range(4):\n    os.fork()", "refused", "os.fork"),
        ("import subprocess\nsubprocess.run(['true'])", "refused", "import _posixsubprocess"),
        ("import os\nos.system('true')", "refused", "os.system"),
        ("import os\nos.execv('/bin/true', ['true'])", "refused", "os.exec"),
        ("import os\nos.posix_spawn('/bin/true', ['true'], {})", "refused", "os.posix_spawn"),
        ("import ctypes", "refused", "import ctypes"),
        ("import _cffi_backend", "refused", "import _cffi_backend"),
        ("import os\nos.kill(os.getppid(), 0)", "refused", "os.kill"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "refused", None),
        ("x = bytearray(4 * 1024**3)", "memory", None),
        ("import socket\ntry:\n    socket.socket()\nexcept OSError:\n    pass", "refused", None),
        ("import socket\nsocket.getaddrinfo('localhost', 80)", "refused", None),
        ("open('/proc/self/mem', 'rb')", "refused", "open"),
        ("import sys\nsys.settrace(lambda *a: None)", "refused", "sys.settrace"),
    ],
)
def test_escapes_are_stopped_and_score_zero(code, reason, detail):
    """Loops, sleeps, forks, spawning, native code, signals, rlimits, memory, network, threads: score 0."""
    result = run_code(code, asserts=["assert True"], config=NO_NETNS)
    assert result.reason == reason and result.score == 0.0 and result.passed == 0
    if detail is not None:
        assert result.detail == detail


def test_threads_left_running_do_not_stall_the_tests():
    """A thread the solution leaves running neither blocks the tests nor hides a failing one."""
    code = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "def f():\n    return 1\n"
    )
    tests = ["assert f() == 1", "assert f() == 2", "assert [][0]"]
    assert run_code(code, asserts=tests, config=CONFIG) == SandboxResult(1, 2, "ok", "")


def test_memory_blow_up_inside_a_test_scores_zero():
    """A MemoryError raised by a test (not the solution) still marks the whole run 'memory'."""
    code = "def grow():\n    return [0] * (10**9)\n"
    assert run_code(code, asserts=["assert grow()"], config=CONFIG).reason == "memory"


def test_writes_outside_the_workdir_are_refused(tmp_path):
    """Writes outside the workdir are refused, also via a patched os.path or a dir_fd; nothing changes."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    attempts = {
        f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')": "open",
        f"open({str(victim)!r}, 'a').write('x')": "open",
        f"import os\nos.remove({str(victim)!r})": "os.remove",
        f"import os\nos.rename({str(victim)!r}, 'stolen.txt')": "os.rename",
        f"import os\nos.mkdir({str(tmp_path / 'd')!r})": "os.mkdir",
        "import os\nos.chdir('..')\nopen('up.txt', 'w')": "open",
    }
    out = str(tmp_path)
    evasions = {  # ways around a naive path check: patched helpers, descriptors relative to a directory
        f"import os\nos.path.realpath = lambda p, **k: os.getcwd()\nopen({out + '/a.txt'!r}, 'w')": "open",
        f"import os\nfd = os.open({out!r}, os.O_RDONLY)\nos.open('b.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd)": "open",
        f"import os\nfd = os.open({out!r}, os.O_RDONLY)\nopen('c.txt', 'w', opener=lambda p, f: os.open(p, f, dir_fd=fd))": "open",
        f"import os\nfd = os.open({out!r}, os.O_RDONLY)\nos.mkdir('d', dir_fd=fd)": "os.mkdir",
        f"import os, pathlib\nos.mkdir(pathlib.Path({out + '/e'!r}))": "os.mkdir",
    }
    attempts.update(evasions)
    for code, event in attempts.items():
        result = run_code(code, asserts=["assert True"], config=CONFIG)
        assert (result.reason, result.detail) == ("refused", event), code
    assert victim.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == [
        "victim.txt"
    ]


def test_writes_inside_the_workdir_are_allowed():
    """The solution may create, read, rename and delete files in its own directory and TMPDIR."""
    code = (
        "import os, tempfile\n"
        "open('a.txt', 'w').write('hi')\nos.rename('a.txt', 'b.txt')\n"
        "data = open('b.txt').read()\nos.remove('b.txt')\n"
        "with tempfile.TemporaryFile() as f:\n    f.write(b'x')\n"
    )
    assert run_code(code, asserts=["assert data == 'hi'"], config=CONFIG).score == 1.0


def test_unbounded_output_is_cut_by_the_file_size_limit():
    """Printing forever fails with EFBIG under RLIMIT_FSIZE instead of filling the disk."""
    config = SandboxConfig(timeout_seconds=5.0, memory_mb=256, max_file_mb=1)
    result = run_code("while True:\n    print('x' * 10000)", asserts=["assert True"], config=config)
    assert result.reason == "error" and "File too large" in result.detail


def test_early_exit_is_not_a_pass():
    """os._exit(0) before the tests run yields no report: 'crashed', score 0."""
    result = run_code("import os\nos._exit(0)", asserts=["assert True"], config=CONFIG)
    assert result.reason == "crashed" and result.score == 0.0


@pytest.mark.skipif(not network_namespace_available(), reason="unshare -n not permitted here")
def test_network_namespace_has_no_route():
    """In the empty network namespace even the hook-free path has no interfaces up."""
    code = "x = open('/proc/net/dev').read().count(':')"
    result = run_code(code, asserts=["assert x == 1"], config=CONFIG)  # only 'lo'
    assert result.score == 1.0


@pytest.mark.parametrize("max_workers", [1, 2])
def test_reward_callable_from_a_thread(max_workers):
    """The reward callable scores a batch (None where no tests), off the main thread, in parallel too."""
    reward = code_execution_reward(CONFIG, max_workers=max_workers)
    completions = [f"```python\n{ADD}```", "```python\nwhile True: pass\n```", "x", "print(1)"]
    tests = [["assert add(1, 2) == 3"], ["assert True"], None, None]
    io_pairs = [None, None, None, [("", "1")]]
    out = {}
    thread = threading.Thread(
        target=lambda: out.setdefault(
            "r", reward([""] * 4, completions, tests=tests, io_pairs=io_pairs)
        )
    )
    thread.start()
    thread.join(timeout=30)
    assert out["r"] == [1.0, 0.0, None, 1.0]


def test_extract_code_and_argument_checks():
    """The last Python-tagged block is used (any case, python3, CRLF), else the last untagged
    one; bad arguments are named."""
    assert extract_code("a\n```python\nx = 1\n```\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_code("```Python\r\nx = 1\r\n```") == "x = 1\r\n"
    assert extract_code("```python3\nx = 1\n```\nOutput:\n```\n5\n```") == "x = 1\n"
    assert extract_code("```\nx = 1\n```\n```text\n5\n```") == "x = 1\n"
    assert extract_code("plain") == "plain"
    with pytest.raises(TypeError, match="asserts must be a list, got a str"):
        run_code(ADD, asserts="assert add(1, 2) == 3", config=CONFIG)
    with pytest.raises(ValueError, match="exactly one"):
        run_code("x", config=CONFIG)
    with pytest.raises(ValueError, match="timeout_seconds"):
        SandboxConfig(timeout_seconds=0)
    assert run_code("x", asserts=[], config=CONFIG).reason == "no_tests"


def _gone_or_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_process_group_kill_reaches_descendants():
    """The group kill used after every run also ends a process the child forked (the backstop)."""
    code = (
        "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "print(pid, flush=True)\ntime.sleep(30)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = int(leader.stdout.readline())
    _kill_group(leader.pid)
    leader.wait(timeout=10)
    leader.stdout.close()
    for _ in range(100):  # SIGKILL delivery is asynchronous: poll up to ~5 s
        if _gone_or_zombie(child):
            break
        time.sleep(0.05)
    assert _gone_or_zombie(child)


def test_reward_columns_checked_and_converted():
    """A str row of tests is refused by row (it would run character by character); a numpy
    row is a list; a column of the wrong length is refused by name."""
    np = pytest.importorskip("numpy")
    reward = code_execution_reward(CONFIG)
    completions = [f"```python\n{ADD}```"] * 2
    tests = np.array([["assert add(1, 2) == 3", "assert add(1, 1) == 3"]] * 2)
    assert reward([""] * 2, completions, tests=tests) == [0.5, 0.5]
    with pytest.raises(TypeError, match=r"tests\[1\] must be a list"):
        reward([""] * 2, completions, tests=[["assert True"], "assert add(1, 2) == 3"])
    with pytest.raises(ValueError, match="the io_pairs column has 1 rows for 2 completions"):
        reward([""] * 2, completions, io_pairs=[[("", "")]])


def test_a_signal_without_a_name_is_reported_by_number():
    """A real-time signal ends the run as 'crashed', not as a ValueError in the reward."""
    from grpo.rewards.sandbox import _stopped

    realtime = signal.SIGRTMIN + 2
    assert _stopped(-realtime, b"", 1) == SandboxResult(0, 1, "crashed", f"signal {realtime}")
    assert _stopped(-signal.SIGKILL, b"", 1).detail == "SIGKILL"
