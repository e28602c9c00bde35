"""The workshop checker: the library's own tests, run against a participant's functions.

In the workshop participants write the pieces of GRPO that matter and the
library supplies the rest. Each part names the participant's
functions and the library functions they stand in for. `check` runs, in a
fresh Python process, the library's own tests for those parts with the
participant's functions patched in before the tests are collected; each part
reports "passed", "not written yet: <function>" or the first invariant that
does not hold, in the words of that test's one-line docstring.

    python -m workshop.check --part 1                 # your workshop/stubs
    python -m workshop.check --module workshop.solutions

The checker and the tests it runs live in the repository (`workshop/`, `tests/`),
not in the `grpo` package: run it from the root of a clone.
Unlike running the test files as they are, only the tests listed in a
part's `tests` are run (the maths and behaviour of the piece, not the library's
input validation or the functions the part does not ask for), and without
tests/conftest.py (none of them uses its fixtures; skipping it saves importing
transformers for the parts that do not need it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PARTS", "Part", "PartResult", "Target", "as_token_loss", "check", "main"]

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests"


@dataclass(frozen=True)
class Target:
    """One function the participant writes, and the library object it replaces."""

    name: str
    """Name of the function in the participant's module."""
    module: str
    """Library module that defines the original."""
    attribute: str
    """The original's name in that module (a function, or a table when `key` is set)."""
    key: str | None = None
    """Entry of the table `attribute` to replace; None when `attribute` is the function."""


@dataclass(frozen=True)
class Part:
    """A piece of GRPO the participant writes, checked by a list of library tests."""

    number: int
    title: str
    module: str
    """File (without .py) of this part in workshop/stubs/ and workshop/solutions/."""
    targets: tuple[Target, ...]
    tests: tuple[str, ...]
    """"file::test" under tests/, optionally "[param=value,...]"; reported in this order."""


_LOSSES = "grpo.functional.losses"
PARTS: tuple[Part, ...] = (
    Part(1, "log-probs with the causal shift", "part1_logprobs",
         (Target("completion_logprobs", "grpo.functional.logprobs", "completion_logprobs"),),
         ("functional/test_logprobs.py::test_completion_logprobs_causal_shift_hand_values",
          "functional/test_logprobs.py::test_completion_logprobs_equals_the_shifted_log_softmax_slice")),
    Part(2, "group advantages", "part2_advantages",
         (Target("group_advantages", "grpo.functional.advantages", "group_advantages"),),
         ("functional/test_advantages.py::test_default_formula_hand_values",
          "functional/test_advantages.py::test_default_equals_the_reshape_mean_std_code",
          "functional/test_advantages.py::test_zero_variance_groups_give_exact_zeros[baseline=mean]",
          "functional/test_advantages.py::test_integer_rewards_accepted_as_float",
          "functional/test_advantages.py::test_positive_only_clamps_negatives",
          "functional/test_advantages.py::test_leave_one_out_hand_values",
          "functional/test_advantages.py::test_batch_scale_and_no_baseline_hand_values",
          "functional/test_advantages.py::test_zero_variance_groups_give_exact_zeros")),
    Part(3, "the GRPO loss", "part3_loss",
         (Target("reinforce", _LOSSES, "POLICY_LOSSES", "reinforce"),
          Target("sequence_mean", _LOSSES, "AGGREGATIONS", "sequence_mean"),
          Target("token_mean", _LOSSES, "AGGREGATIONS", "token_mean"),
          Target("constant_length", _LOSSES, "AGGREGATIONS", "constant_length"),
          Target("sequence_sum", _LOSSES, "AGGREGATIONS", "sequence_sum")),
         ("functional/test_losses.py::test_reinforce_aggregations_hand_values",
          "functional/test_losses.py::test_aggregate_hand_value",
          "functional/test_losses.py::test_clipped_at_ratio_one_has_reinforce_gradient",
          "functional/test_losses.py::test_sequences_without_counted_tokens_give_no_nan",
          "functional/test_losses.py::test_padding_garbage_changes_no_loss_and_no_gradient"
          "[loss_type=reinforce]",
          "functional/test_losses.py::test_extra_padding_columns_change_nothing"
          "[loss_type=reinforce]")),
    Part(4, "the rollout loop", "part4_rollout",
         (Target("collect_rollouts", "grpo.envs.rollout", "collect_rollouts"),),
         ("envs/test_rollout.py::test_agent_is_asked_only_for_unfinished_episodes",
          "envs/test_rollout.py::test_max_turns_truncates",
          "envs/test_rollout.py::test_batched_env_is_accepted_and_rerun")),
    Part(5, "the assistant mask by incremental tokenisation", "part5_chat_mask",
         (Target("tokenize_with_assistant_mask", "grpo.envs.chat_mask",
                 "tokenize_with_assistant_mask"),),
         ("envs/test_chat_mask.py::test_hand_checked_mask",
          "envs/test_chat_mask.py::test_mask_matches_full_rendering",
          "envs/test_chat_mask.py::test_sampled_ids_replace_retokenisation",
          "envs/test_chat_mask.py::test_rollout_tokens_uses_the_episode_ids",
          "envs/test_chat_mask.py::test_template_tokens_after_the_sampled_end_of_turn_follow_unmasked",
          "envs/test_chat_mask.py::test_a_turn_known_to_be_cut_gets_the_whole_closing",
          "envs/test_chat_mask.py::test_non_append_only_template_is_caught")),
    Part(6, "a reward parser", "part6_parsers",
         (Target("compose_parsers", "grpo.rewards.parsers", "compose_parsers"),),
         ("rewards/test_parsers.py::test_each_parser_sees_the_previous_action_and_rewards_add_up",
          "rewards/test_parsers.py::test_first_failure_short_circuits_and_keeps_its_obs",
          "rewards/test_parsers.py::test_tag_then_int_parsers_compose")),
)  # fmt: skip
"""The six parts; their tests are library tests that hold for any correct version."""

PARTS_BY_NUMBER = {part.number: part for part in PARTS}


@dataclass(frozen=True)
class PartResult:
    """What the checker found for one part."""

    number: int
    title: str
    status: str
    """"passed", "not written", "failed" or "error" (could not import or run the code)."""
    message: str
    """One line in plain words: the first failing invariant, or what is missing."""
    passed: int = 0
    """How many of the part's tests passed."""
    total: int = 0
    """How many tests the part ran."""
    test: str = ""
    """Node id of the first failing test, when one failed."""
    reason: str = ""
    """First line of that test's error, e.g. "AssertionError: Tensor-likes are not close!"."""


def as_token_loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A per-token loss that may return a plain (N, T) tensor, as a `POLICY_LOSSES` entry.

    The library's entries return a `TokenLoss` (loss, ratio, clip flags); a
    REINFORCE written in the workshop may return only the loss: the ratio
    (1 on-policy) and the never-clipped flags are filled in here.
    """
    import torch

    from grpo.functional.losses import TokenLoss

    def token_loss(logprobs, old_logprobs, advantages, completion_mask, clip):
        out = fn(logprobs, old_logprobs, advantages, completion_mask, clip)
        if isinstance(out, TokenLoss):
            return out
        never = torch.zeros_like(completion_mask)
        return TokenLoss(out, torch.exp(logprobs - old_logprobs).detach(), never, never)

    token_loss.__wrapped__ = fn
    return token_loss


def _parts(part: int | None) -> tuple[Part, ...]:
    if part is None:
        return PARTS
    if part not in PARTS_BY_NUMBER:
        raise ValueError(f"part: got {part!r}; allowed: {', '.join(map(str, PARTS_BY_NUMBER))}")
    return (PARTS_BY_NUMBER[part],)


def check(part: int | None = None, module: str = "workshop.stubs", *, timeout: float = 300):
    """Run the library's tests of `part` (None = every part) against `module`'s functions.

    `module` is a package holding one file per part (`workshop.stubs` or
    `workshop.solutions`, or a copy of them). Returns one `PartResult` per part.
    """
    parts = _parts(part)
    if not TESTS_DIR.is_dir():
        raise FileNotFoundError(
            f"the library's tests were not found at {TESTS_DIR}; the workshop checker runs "
            "from a clone of the repository (git clone, then pip install -e '.[dev]')"
        )
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        numbers = ",".join(str(p.number) for p in parts)
        command = [sys.executable, "-m", "workshop.check", "_run", module, numbers, str(report)]
        paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        try:
            run = subprocess.run(
                command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            message = f"the tests did not finish in {timeout:g} s (an endless loop?)"
            return [PartResult(p.number, p.title, "error", message) for p in parts]
        if not report.exists():
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            message = f"the tests could not run: {tail[0]}"
            return [PartResult(p.number, p.title, "error", message) for p in parts]
        found = json.loads(report.read_text())
    return [_summarise(p, found["errors"].get(str(p.number)), found["tests"]) for p in parts]


def _entry_matches(entry: str, nodeid: str, params: dict[str, str]) -> bool:
    path_name, _, wanted = entry.partition("[")
    if nodeid.split("[")[0] != "tests/" + path_name:
        return False
    pairs = (item.split("=", 1) for item in wanted.rstrip("]").split(",") if item)
    return all(params.get(key) == value for key, value in pairs)


def _summarise(part: Part, error: str | None, tests: list[dict[str, Any]]) -> PartResult:
    if error is not None:
        return PartResult(part.number, part.title, "error", error)
    ordered, missing = [], []
    for entry in part.tests:
        matched = [t for t in tests if _entry_matches(entry, t["nodeid"], t["params"])]
        ordered += [t for t in matched if t not in ordered]
        if not matched:
            missing.append(entry)
    if missing:
        message = f"the library test {missing[0]} was not found in tests/"
        return PartResult(part.number, part.title, "error", message)
    passed = sum(t["passed"] for t in ordered)
    counts = {"passed": passed, "total": len(ordered)}
    failing = next((t for t in ordered if not t["passed"]), None)
    if failing is None:
        return PartResult(part.number, part.title, "passed", "passed", **counts)
    if failing["not_written"]:
        message = f"not written yet: {failing['not_written']}"
        return PartResult(part.number, part.title, "not written", message, **counts)
    return PartResult(
        part.number, part.title, "failed", failing["doc"], **counts,
        test=failing["nodeid"], reason=failing["reason"],
    )  # fmt: skip


# ------------------------------------------------------------ inside the test process
def _patch(target: Target, fn: Callable[..., Any]) -> None:
    """Put `fn` wherever the library's original can be reached from, before tests import it."""
    library = importlib.import_module(target.module)
    original = getattr(library, target.attribute)
    if target.key is not None:  # a table entry: the dict is shared by every importer
        original[target.key] = as_token_loss(fn) if target.attribute == "POLICY_LOSSES" else fn
        return
    # the defining module and every package or module that re-exported the name
    for name, loaded in list(sys.modules.items()):
        if name.split(".")[0] == "grpo" and getattr(loaded, target.attribute, None) is original:
            setattr(loaded, target.attribute, fn)


def _load_part(module: str, part: Part) -> tuple[str, str | None]:
    """Import the participant's file of `part` and patch it in: (its path, error or None)."""
    name = f"{module}.{part.module}"
    try:
        participant = importlib.import_module(name)
    except Exception as error:  # a syntax error or a bad import in the participant's file
        return "", f"could not import {name}: {type(error).__name__}: {_first_line(str(error))}"
    for target in part.targets:
        fn = getattr(participant, target.name, None)
        if not callable(fn):
            return "", f"{name} has no function {target.name}"
        _patch(target, fn)
    return str(Path(participant.__file__).resolve()), None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


class _Recorder:
    """Pytest plugin: keeps only the listed tests and records how each one went."""

    def __init__(self, parts: Sequence[Part], files: dict[str, str]) -> None:
        self.parts, self.files, self.tests = parts, files, []

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        entries = [entry for part in self.parts for entry in part.tests]
        keep = [i for i in items if any(_entry_matches(e, i.nodeid, _params(i)) for e in entries)]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep

    def pytest_runtest_makereport(self, item, call) -> None:
        if call.when == "teardown" or (call.when == "setup" and call.excinfo is None):
            return
        record = {
            "nodeid": item.nodeid,
            "params": _params(item),
            "doc": _first_line(getattr(item.obj, "__doc__", None) or item.name),
            # a test that skips itself (a missing optional dependency) is not held against the code
            "passed": call.excinfo is None or call.excinfo.typename == "Skipped",
            "not_written": None,
            "reason": "",
        }
        if not record["passed"]:
            error = call.excinfo.value
            record["reason"] = f"{type(error).__name__}: {_first_line(str(error))}"[:300]
            if isinstance(error, NotImplementedError):
                record["not_written"] = self._unwritten(call.excinfo.tb)
        self.tests.append(record)

    def _unwritten(self, tb) -> str | None:
        """The innermost participant function on the traceback (the one that raised)."""
        name = None
        while tb is not None:
            if str(Path(tb.tb_frame.f_code.co_filename).resolve()) in self.files.values():
                name = tb.tb_frame.f_code.co_name
            tb = tb.tb_next
        return name


def _params(item: Any) -> dict[str, str]:
    callspec = getattr(item, "callspec", None)
    return {k: str(v) for k, v in callspec.params.items()} if callspec else {}


def _run_tests(module: str, numbers: str, report: str) -> int:
    import pytest

    sys.path.insert(0, str(REPO_ROOT))
    parts = [PARTS_BY_NUMBER[int(n)] for n in numbers.split(",")]
    files, errors = {}, {}
    for part in parts:
        path, error = _load_part(module, part)
        files[str(part.number)] = path
        if error is not None:
            errors[str(part.number)] = error
    runnable = [p for p in parts if str(p.number) not in errors]
    recorder = _Recorder(runnable, files)
    paths = sorted({str(TESTS_DIR / e.split("::")[0]) for p in runnable for e in p.tests})
    if paths:
        args = ["-q", "-p", "no:cacheprovider", "--noconftest", "--rootdir", str(REPO_ROOT), *paths]
        pytest.main(args, plugins=[recorder])
    Path(report).write_text(json.dumps({"errors": errors, "tests": recorder.tests}))
    return 0


def _format(result: PartResult) -> str:
    head = f"part {result.number}  {result.title:<48}"
    if result.status in ("passed", "not written", "error"):
        count = f" ({result.passed}/{result.total})" if result.status == "passed" else ""
        return f"{head}{result.message}{count}"
    lines = [f"{head}failed ({result.passed}/{result.total} hold)"]
    lines.append(f"        first invariant that does not hold: {result.message}")
    lines.append(f"        test: {result.test}")
    if result.reason:
        lines.append(f"        why:  {result.reason}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`[--part N] [--module PACKAGE]`: print one verdict per part; 0 when all passed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_run"]:  # the test process started by `check`
        return _run_tests(*argv[1:4])
    parser = argparse.ArgumentParser(
        prog="python -m workshop.check", description="Check your workshop functions with the library's tests."
    )
    parser.add_argument("--part", type=int, choices=sorted(PARTS_BY_NUMBER), default=None,
                        help="one part (default: every part)")  # fmt: skip
    parser.add_argument(
        "--module", default="workshop.stubs", help="package with one file per part"
    )
    options = parser.parse_args(argv)
    try:
        results = check(options.part, options.module)
    except FileNotFoundError as error:  # an installed wheel has no tests/ to run
        print(error, file=sys.stderr)
        return 2
    for result in results:
        print(_format(result))
    return 0 if all(r.status == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
