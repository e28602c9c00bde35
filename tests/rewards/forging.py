"""What the forging tests share: the sandbox's settings, a failing solution and its tests,
and the check that an attack scored 0 for the expected reason."""

from grpo.rewards.sandbox import SandboxConfig, run_code

CONFIG = SandboxConfig(timeout_seconds=2.0, memory_mb=256, isolate_network=False)
FAKE = '{"passed": 1, "failed": 0, "reason": "ok", "detail": ""}'  # the pre-hardening report
WRONG_ADD = "def add(a, b):\n    return a - b\n"
FAILING = ["assert add(1, 2) == 3"]  # fails for WRONG_ADD

# How each attack ends, (reason, detail): which defence stopped it. "ok" with nothing passed:
# the tests ran to their end and failed, the attack having changed nothing the parent reads.
RAN = ("ok", "")
UNSIGNED = ("crashed", "exit status 0 without a signed report")


IO_PAIRS = [("3\n", "6\n"), ("5\n", "10\n")]  # stdin/stdout cases a doubling program passes


def assert_forging_fails(code, stopped_by, tests=FAILING, io_pairs=None):
    """`code` scores 0 against `tests` (against `io_pairs` when given), stopped by the defence
    `stopped_by` names."""
    job = {"asserts": tests} if io_pairs is None else {"io_pairs": io_pairs}
    result = run_code(code, config=CONFIG, **job)
    assert (result.passed, result.score) == (0, 0.0), result
    assert (result.reason, result.detail) == stopped_by, result
