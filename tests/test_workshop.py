"""Tests for workshop/check.py (the checker) and the workshop/ folder it checks."""

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workshop/ is at a clone's root

import workshop.check  # noqa: E402
from workshop.check import PARTS, _format, check, main  # noqa: E402


def test_solutions_pass_every_part():
    """The library's own functions, as workshop.solutions, pass every test of every part."""
    results = check(module="workshop.solutions")
    assert [r.number for r in results] == [p.number for p in PARTS]
    for result in results:
        assert result.status == "passed", _format(result)
        assert result.passed == result.total >= 2


def test_untouched_stubs_say_not_written_without_a_traceback(capsys):
    """Every untouched stub is reported as "not written yet: <its first function>", no traceback."""
    assert main([]) == 1
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == len(PARTS) and "Traceback" not in out
    for line, part in zip(lines, PARTS, strict=True):
        assert line.startswith(f"part {part.number}  {part.title}")
        assert line.endswith(f"not written yet: {part.targets[0].name}")


def _write(folder, files):
    for name, source in files.items():
        (folder / name).write_text(textwrap.dedent(source))


def test_wrong_code_names_the_first_invariant_that_does_not_hold(tmp_path, monkeypatch):
    """A missing shift, a syntax error, a missing function and a missing file each get one plain line."""
    package = tmp_path / "attempt"
    package.mkdir()
    _write(
        package,
        {
            "__init__.py": "",
            # forgets the causal shift: scores token t with the logits at t
            "part1_logprobs.py": """
                def completion_logprobs(logits, completion_ids, temperature=1.0):
                    T = completion_ids.shape[1]
                    scores = (logits[:, -T:] / temperature).log_softmax(-1)
                    return scores.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
            """,
            "part2_advantages.py": "def group_advantages(rewards, group_size:\n",
            "part3_loss.py": "def reinforce(logprobs, old, advantages, mask, clip):\n    return 0\n",
        },
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    results = {r.number: r for r in check(module="attempt")}
    shift = results[1]
    assert shift.status == "failed" and shift.passed == 0
    assert shift.message == (
        "Positions P-1..P+T-2 score the T completion tokens; the last position is ignored."
    )
    assert shift.test.endswith("test_completion_logprobs_causal_shift_hand_values")
    assert results[2].status == "error" and "SyntaxError" in results[2].message
    assert results[3].message == "attempt.part3_loss has no function sequence_mean"
    assert "ModuleNotFoundError" in results[4].message
    assert all("Traceback" not in _format(r) for r in results.values())


def test_solutions_are_the_library_objects():
    """Each solution is the library's own function (or table entry), so it cannot drift."""
    for part in PARTS:
        solution = importlib.import_module(f"workshop.solutions.{part.module}")
        stub = importlib.import_module(f"workshop.stubs.{part.module}")
        assert stub.__doc__ and f"--part {part.number}" in stub.__doc__
        for target in part.targets:
            original = getattr(importlib.import_module(target.module), target.attribute)
            if target.key is not None:
                original = original[target.key]
            assert getattr(solution, target.name) is original
            assert callable(getattr(stub, target.name))


def test_train_with_solutions_improves_and_stubs_name_part_1():
    """The default 120 GRPO steps with the solutions raise the share correct; stubs stop at part 1."""
    train = importlib.import_module("workshop.train")
    messages = []
    assert train.train(train.parse_args(["--use", "stubs"]), log=messages.append) is None
    assert messages[0].startswith("part 1 (log-probs with the causal shift) is not written yet")
    history = train.train(train.parse_args(["--use", "solutions"]), log=lambda line: None)
    first = sum(m["correct"] for m in history[:8]) / 8
    last = sum(m["correct"] for m in history[-8:]) / 8
    assert last > first + 0.15, (first, last)


def test_scratch_checks_accept_the_seed_forms_and_catch_a_missing_shift(capsys):
    """scratch.py's checks pass picoRL's one-liners, reject an unshifted get_logprobs."""
    scratch = importlib.import_module("workshop.scratch")

    def unshifted(logits, ids):
        return logits[:, 1:].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def shifted(logits, ids):
        return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def advantages(rewards, group_size, normalize=True):
        grouped = rewards.view(-1, group_size)
        centred = grouped - grouped.mean(1, keepdim=True)
        return (centred / (grouped.std(1, keepdim=True) + 1e-4) if normalize else centred).view(-1)

    def loss(logprobs, mask, adv):
        return -(adv * torch.where(mask, logprobs, 0.0).sum(1)).mean()

    scratch.check_get_logprobs(shifted)
    scratch.check_compute_advantages(advantages)
    scratch.check_grpo_loss(loss)
    with pytest.raises(AssertionError, match="token 1"):
        scratch.check_get_logprobs(unshifted)
    with pytest.raises(AssertionError):
        scratch.check_grpo_loss(lambda lp, m, a: -loss(lp, m, a))
    assert scratch.main([]) == 0
    assert capsys.readouterr().out.count("not written yet") == len(scratch.CHECKS)


def test_without_the_tests_folder_the_checker_says_to_use_a_clone(tmp_path, monkeypatch, capsys):
    """Outside a clone (no tests/ beside the package) the checker explains instead of failing."""
    monkeypatch.setattr(workshop.check, "TESTS_DIR", tmp_path / "tests")
    with pytest.raises(FileNotFoundError, match="clone of the repository"):
        check(1)
    assert main(["--part", "1"]) == 2
    assert "clone of the repository" in capsys.readouterr().err
    with pytest.raises(ValueError, match="^part: got 7"):
        check(7)
