"""Forging attempts against grpo.rewards.sandbox: each one must score 0.

Each snippet is what a model trained on code rewards could learn to write: it
fails its tests honestly, then tries to make the sandbox report a pass anyway
by tampering with what the harness uses to decide or to report the verdict.
These write FAKE, the report of the harness from before verdicts moved to the
parent (22 of the 37 attempts up to the io ones scored a pass then); the
attacks on the signed report itself are in test_sandbox_nonce.py.
"""

import pytest

from tests.rewards.forging import (
    FAKE,
    IO_PAIRS,
    RAN,
    UNSIGNED,
    WRONG_ADD,
    assert_forging_fails,
)

# Writes FAKE to every descriptor that might be the result channel, then leaves quietly.
_WRITE_EVERYWHERE = f"""
import os
def write_everywhere():
    for fd in range(1, 64):
        try:
            os.lseek(fd, 0, 0)
        except OSError:
            pass
        try:
            os.write(fd, {FAKE!r}.encode())
        except OSError:
            pass
    os._exit(0)
"""

# Walks frames from `start` upwards; writes FAKE into any open file object found in their locals.
_FORGE_FROM_FRAMES = f"""
import os, sys
def forge_from(frame):
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if hasattr(value, "write") and hasattr(value, "fileno"):
                try:
                    if value.fileno() > 2:
                        value.seek(0)
                        value.write({FAKE!r})
                        value.flush()
                        os._exit(0)
                except Exception:
                    pass
        frame = frame.f_back
"""


@pytest.mark.parametrize(
    "attack",
    [
        "import json\n"
        f"json.dumps = lambda *a, **k: {FAKE!r}\n"
        "json.dump = lambda obj, fp, *a, **k: fp.write(json.dumps(obj))\n",
        "import json\n"
        "real = json.JSONEncoder.encode\n"
        "json.JSONEncoder.encode = lambda self, o: real(self, {**o, 'passed': 1, 'failed': 0})"
        " if isinstance(o, dict) and 'passed' in o else real(self, o)\n",
    ],
    ids=["dumps", "encoder"],
)
def test_patched_json_cannot_forge(attack):
    """Replacing json.dump/json.dumps (or its encoder) does not turn a failing test into a pass."""
    assert_forging_fails(WRONG_ADD + attack, RAN)


def test_patched_harness_module_cannot_forge():
    """Rewriting the harness module's globals (via sys.modules) does not turn a failing test into a pass."""
    attack = (
        "import sys, json\n"
        "class FakeJson:\n"
        f"    dumps = staticmethod(lambda *a, **k: {FAKE!r})\n"
        "    loads = staticmethod(json.loads)\n"
        "for name, module in list(sys.modules.items()):\n"
        "    if name == '__main__' or 'sandbox' in name:\n"
        "        for attr in list(vars(module)):\n"
        "            if attr == 'json':\n"
        "                setattr(module, attr, FakeJson)\n"
        "            elif attr.startswith('_run') or attr == '_normalise':\n"
        "                setattr(module, attr, lambda *a, **k: (1, 0, 'ok', ''))\n"
    )
    assert_forging_fails(WRONG_ADD + attack, RAN)


def test_patched_builtins_cannot_forge():
    """No-op builtins.exec/eval/compile do not skip the tests."""
    attack = (
        "import builtins\n"
        "real_compile = compile\n"
        "builtins.exec = lambda *a, **k: None\n"
        "builtins.eval = lambda *a, **k: True\n"
        "builtins.compile = lambda *a, **k: real_compile('pass', '<x>', 'exec')\n"
    )
    assert_forging_fails(WRONG_ADD + attack, RAN, tests=["assert False", "assert add(1, 2) == 3"])


def test_patched_exit_and_atexit_cannot_forge():
    """A no-op os._exit plus an atexit hook that rewrites the result descriptors does not forge."""
    attack = (
        _WRITE_EVERYWHERE + "import atexit, os\n"
        "atexit.register(write_everywhere)\n"
        "os._exit = lambda code: None\n"
    )
    assert_forging_fails(WRONG_ADD + attack, RAN)


@pytest.mark.parametrize(
    "start",
    [
        "sys._getframe()",
        "__import__('inspect').currentframe()",
    ],
    ids=["getframe", "inspect"],
)
def test_frame_walking_cannot_forge(start):
    """Walking up the caller frames to the harness and writing through its objects does not forge."""
    attack = _FORGE_FROM_FRAMES + f"def add(a, b):\n    forge_from({start})\n    return a - b\n"
    assert_forging_fails(attack, RAN)


def test_traceback_walking_cannot_forge():
    """Reaching the harness frames through a caught exception's traceback does not forge."""
    attack = _FORGE_FROM_FRAMES + (
        "def add(a, b):\n"
        "    try:\n"
        "        raise ValueError\n"
        "    except ValueError as error:\n"
        "        forge_from(error.__traceback__.tb_frame)\n"
        "    return a - b\n"
    )
    assert_forging_fails(attack, RAN)


def test_inspect_and_thread_frames_cannot_forge():
    """inspect.stack() and sys._current_frames() lead to nothing that can write a pass."""
    attack = _FORGE_FROM_FRAMES + (
        "import inspect\n"
        "def add(a, b):\n"
        "    for info in inspect.stack():\n"
        "        forge_from(info.frame)\n"
        "    for frame in sys._current_frames().values():\n"
        "        forge_from(frame)\n"
        "    return a - b\n"
    )
    assert_forging_fails(attack, ("refused", "sys._current_frames"))


def test_gc_walking_cannot_forge():
    """Searching the heap with gc.get_objects() for the result file does not forge."""
    attack = (
        "import gc, os\n"
        "for obj in gc.get_objects():\n"
        "    if hasattr(obj, 'write') and hasattr(obj, 'fileno'):\n"
        f"        obj.write({FAKE!r})\n"
        "os._exit(0)\n"
    )
    assert_forging_fails(WRONG_ADD + attack, ("refused", "gc.get_objects"))


@pytest.mark.parametrize(
    ("attack", "stopped_by"),
    [
        ("import sys\nsys.exit(0)", ("error", "exited before finishing (SystemExit)")),
        ("import os\nos._exit(0)", UNSIGNED),
        ("import os\ndef add(a, b):\n    os._exit(0)\n", UNSIGNED),
        ("def add(a, b):\n    raise SystemExit(0)\n", RAN),  # counted as the test's failure
        ("class Bye:\n    def __del__(self):\n        raise SystemExit(0)\nkeep = Bye()\n", RAN),
        (
            "import os\nclass Bye:\n    def __del__(self):\n        os._exit(0)\nkeep = Bye()\n",
            RAN,
        ),  # fmt: skip
    ],
    ids=[
        "sys.exit",
        "os._exit",
        "os._exit-in-test",
        "SystemExit-in-test",
        "SystemExit-in-del",
        "os._exit-in-del",
    ],
)
def test_exiting_early_with_status_zero_does_not_pass(attack, stopped_by):
    """Leaving with exit status 0 before the harness reports (or from a finaliser) scores 0."""
    assert_forging_fails(WRONG_ADD + attack, stopped_by)


@pytest.mark.parametrize(
    ("attack", "stopped_by"),
    [
        (_WRITE_EVERYWHERE + "write_everywhere()\n", UNSIGNED),
        (f"import sys\nprint({FAKE!r})\nsys.stderr.write({FAKE!r})\n", RAN),
        (f"open('../result.json', 'w').write({FAKE!r})\n", ("refused", "open")),
        (f"open('/proc/self/fd/3', 'w').write({FAKE!r})\n", ("refused", "open")),
    ],
    ids=["every-fd", "stdout-stderr", "result-path", "proc-fd"],
)
def test_writing_a_fake_result_does_not_pass(attack, stopped_by):
    """A fake verdict written to stdout, stderr, the result file's path or any descriptor scores 0."""
    assert_forging_fails(WRONG_ADD + attack, stopped_by)


def test_signal_handler_cannot_forge():
    """A signal handler that would fire later and write a fake result cannot even be set: the
    submitted code runs off the main thread, where signal.signal raises."""
    attack = _WRITE_EVERYWHERE + (
        "import signal\n"
        "signal.signal(signal.SIGALRM, lambda *args: write_everywhere())\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
        "def add(a, b):\n"
        "    import time\n"
        "    time.sleep(0.2)\n"
        "    return a - b\n"
    )
    stopped_by = ("error", "ValueError: signal only works in main thread of the main interpreter")
    assert_forging_fails(attack, stopped_by)


@pytest.mark.parametrize(
    ("attack", "stopped_by"),
    [
        (  # print the expected output found in the harness's frames
            "import sys\n"
            "frame = sys._getframe()\n"
            "while frame is not None:\n"
            "    if 'expected' in frame.f_locals:\n"
            "        print(frame.f_locals['expected'])\n"
            "    frame = frame.f_back\n",
            RAN,
        ),
        (  # make the harness's comparison ignore the output
            "import sys\nsys.modules['__main__']._normalise = lambda text: ''\n",
            RAN,
        ),
        (  # override print to write the expected output instead
            "import builtins, sys\n"
            "def lying_print(*args, **kwargs):\n"
            "    frame = sys._getframe()\n"
            "    while frame is not None:\n"
            "        if 'expected' in frame.f_locals:\n"
            "            sys.stdout.write(frame.f_locals['expected'])\n"
            "        frame = frame.f_back\n"
            "builtins.print = lying_print\n"
            "print('anything')\n",
            RAN,
        ),
        (  # a passing report written everywhere: the parent reads no outputs from it
            _WRITE_EVERYWHERE.replace(
                FAKE, '{"passed": 2, "failed": 0, "reason": "ok", "detail": ""}'
            )
            + "write_everywhere()\n",
            ("crashed", "exit status 0 without a report"),
        ),
    ],
    ids=["read-expected", "patch-normalise", "override-print", "fake-result"],
)
def test_io_forging_does_not_pass(attack, stopped_by):
    """stdin/stdout programs cannot read the expected output, patch the comparison or fake the
    report: the parent compares the outputs itself."""
    assert_forging_fails(attack, stopped_by, io_pairs=IO_PAIRS)
