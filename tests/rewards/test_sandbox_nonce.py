"""Attacks on the sandbox's signed report: the submitted code hunts for the run's nonce
(the key the parent signs verdicts with) everywhere it can reach, and signs a pass if it
finds it; a control leaks the nonce to show the hunt would forge."""

import hashlib

import pytest

from grpo.rewards import sandbox
from grpo.rewards.sandbox import run_code
from tests.rewards.forging import CONFIG, RAN, assert_forging_fails

KEY = "ab" * 32  # the nonce the parent draws, fixed for the tests below


def _forged_report():
    """A report the parent accepts for one passing truth test, signed with KEY."""
    payload = b'{"error":null,"tests":[[true]]}'
    mac = hashlib.blake2b(payload, key=bytes.fromhex(KEY), digest_size=32).hexdigest()
    return payload + b"\n" + mac.encode() + b"\n"


# Looks for KEY in every place the submitted code can reach; if found, writes a signed pass.
_HUNT = f"""
import os, sys
YEK = {KEY[::-1]!r}  # reversed, so that the hunt does not find its own copy
def holds_key(value, depth=0):
    try:
        if isinstance(value, (str, bytes)):
            key = YEK[::-1]
            return value == key or value == bytes.fromhex(key) or value == key.encode()
        if depth > 3:
            return False
        if isinstance(value, dict):
            return any(holds_key(v, depth + 1) for v in list(value.values()))
        if isinstance(value, (list, tuple, set, frozenset)):
            return any(holds_key(v, depth + 1) for v in list(value))
        if callable(value):
            # Closures and bound objects: reading them raises no audit event.
            cells = [c.cell_contents for c in getattr(value, "__closure__", None) or ()]
            return any(holds_key(v, depth + 1) for v in cells + [getattr(value, "__self__", None)])
    except Exception:
        pass
    return False
def forge():
    for fd in range(3, 64):
        try:
            os.pwrite(fd, {_forged_report()!r}, 0)
        except OSError:
            pass
    os._exit(0)
def hunt(frame=None, looks_around=True):
    frame = frame or sys._getframe()
    while frame is not None:
        if holds_key(dict(frame.f_locals)) or holds_key(frame.f_globals):
            forge()
        frame = frame.f_back
    for module in list(sys.modules.values()):
        if holds_key(getattr(module, "__dict__", {{}})):
            forge()
    if holds_key(sys.unraisablehook) or holds_key(vars(sys)):
        forge()
    if looks_around:
        for frame in sys._current_frames().values():  # refused: the last resort
            hunt(frame)
WORKERS = set()  # threads that ran this code on purpose; any other one is the harness's
def off_workers():
    import threading
    return threading.get_ident() not in WORKERS
def via_signal_handler():  # a handler receives the main thread's current frame
    import signal
    try:
        signal.signal(signal.SIGALRM, lambda signum, frame: hunt(frame, looks_around=False))
        signal.setitimer(signal.ITIMER_REAL, 0.001)
        import time
        time.sleep(0.1)
    except ValueError:  # not the main thread: look around directly instead
        hunt(looks_around=False)
"""
IS_EVEN = "def is_even(n):\n    hunt()\n    return n % 2 == 1\n"  # wrong, and hunting
ODD_IS_EVEN = ["assert is_even(4)"]  # fails for IS_EVEN; the forged report says it passed


def test_queues_in_reach_carry_no_verdicts():
    """Stuffing fake values into every queue the solution can reach does not pass a test."""
    attack = _HUNT.replace(
        "def holds_key(value, depth=0):\n",
        "def holds_key(value, depth=0):\n"
        "    if hasattr(value, 'put') and hasattr(value, 'get_nowait'):\n"
        "        for index in range(8):\n"
        "            for fake in (True, (True, 'ok'), (index, True)):\n"
        "                value.put((index, fake))\n",
    ).replace("    if looks_around:", "    if False:")
    assert_forging_fails(attack + IS_EVEN, RAN, tests=ODD_IS_EVEN + ["assert is_even(4) == True"])


@pytest.fixture
def fixed_nonce(monkeypatch):
    monkeypatch.setattr(sandbox.secrets, "token_hex", lambda nbytes: KEY)


def test_a_reachable_nonce_would_forge(fixed_nonce):
    """Control: with the nonce in the solution's reach, the hunt below does forge a pass."""
    code = f"LEAKED = {KEY!r}\n" + _HUNT + IS_EVEN
    assert run_code(code, asserts=ODD_IS_EVEN, config=CONFIG).score == 1.0


def test_the_nonce_is_out_of_reach(fixed_nonce):
    """Frames, module globals, closures, sys hooks and other threads' frames do not yield the nonce."""
    assert_forging_fails(_HUNT + IS_EVEN, ("refused", "sys._current_frames"), tests=ODD_IS_EVEN)


@pytest.mark.parametrize(
    "trigger",
    [
        "gc.callbacks.append(lambda phase, info: off_workers() and ATTACK())\n",
        "class Cycle:\n    def __del__(self):\n        off_workers() and ATTACK()\n"
        "    def __init__(self):\n        self.me = self\n",
    ],
    ids=["gc-callback", "finaliser"],
)
@pytest.mark.parametrize("attack", ["hunt", "via_signal_handler"])
def test_code_run_on_the_harness_thread_cannot_look_around(fixed_nonce, trigger, attack):
    """A gc callback or finaliser run on the harness's thread is refused at its first look at frames."""
    # Thresholds of 1 make the harness's next allocation collect, on its own thread.
    code = _HUNT + "import gc, threading\nWORKERS.add(threading.get_ident())\n"
    code += trigger.replace("ATTACK", attack) + (
        "def is_even(n):\n"
        "    WORKERS.add(threading.get_ident())\n"
        "    garbage = [Cycle() for _ in range(100)] if 'Cycle' in globals() else []\n"
        "    gc.collect(0)\n"  # promotes the cycles out of the generation a worker collects
        "    del garbage\n"
        "    gc.set_threshold(1, 1, 1)\n"
        "    return n % 2 == 1\n"
    )
    result = run_code(code, asserts=ODD_IS_EVEN, config=CONFIG)
    assert (result.passed, result.reason, result.detail) == (0, "refused", "sys._getframe")
