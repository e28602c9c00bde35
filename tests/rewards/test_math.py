"""Tests for grpo.rewards.math: math-verify answers, main thread and worker threads."""

import threading
import time

import pytest
from threads import run_in_thread

math_verify = pytest.importorskip("math_verify")

from grpo.rewards.math import math_answer_reward, verify_answer  # noqa: E402

COMPLETIONS = [
    "The answer is $\\boxed{\\frac{1}{2}}$.",  # equal to 0.5 symbolically
    "So we get $\\boxed{0.5}$",
    "I think it is $\\boxed{3}$",
    "no idea",
    "whatever",
]
ANSWERS = ["0.5", "1/2", "4", "7", None]
EXPECTED = [1.0, 1.0, 0.0, 0.0, None]


def test_math_reward_exact_values_in_main_thread():
    """Equivalent forms match, wrong or missing answers score 0, rows without gold get None."""
    assert threading.current_thread() is threading.main_thread()
    assert math_answer_reward([""] * 5, COMPLETIONS, ANSWERS) == EXPECTED


def test_math_reward_from_a_worker_thread():
    """Outside the main thread (where signal.alarm raises) the reward still gives the same values."""
    results = {}

    def work():
        results["main"] = threading.current_thread() is threading.main_thread()
        results["scores"] = math_answer_reward([""] * 5, COMPLETIONS, ANSWERS)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert results == {"main": False, "scores": EXPECTED}


def test_verify_answer_handles_garbage():
    """Unparseable text is a wrong answer, not an exception."""
    assert verify_answer("\\frac{", "1") is False
    assert verify_answer("$\\boxed{2}$", "2") is True


def test_length_mismatch_is_rejected():
    """completions and answer must align."""
    with pytest.raises(ValueError, match="same length"):
        math_answer_reward(["", ""], ["1", "2"], ["1"])


def _parse_that_spins(seconds: float):
    """A math_verify.parse that spins in Python for `seconds` on "spin", as a pathological
    expression does, and parses anything else as math-verify would."""
    real = math_verify.parse

    def parse(text, *args, **kwargs):
        if "spin" in text:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                pass
            return []
        return real(text, *args, **kwargs)

    return parse


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_pathological_answer_is_wrong_after_its_timeout_in_any_thread(monkeypatch, in_thread):
    """A check still parsing after timeout_seconds scores False there, in the main thread and in
    a sampling thread alike (where math-verify's signal.alarm cannot run), and the next answer is
    checked as usual: nothing of the stopped check is left pending."""
    monkeypatch.setattr(math_verify, "parse", _parse_that_spins(30.0))
    results = {}

    def work():
        begin = time.monotonic()
        results["spin"] = verify_answer("spin", "2", timeout_seconds=0.3)
        results["seconds"] = time.monotonic() - begin
        results["next"] = verify_answer("$\\boxed{2}$", "2", timeout_seconds=0.3)
        time.sleep(0.5)  # past the limit again: a stray timer would raise here
        results["after"] = math_answer_reward([""], ["$\\boxed{3}$"], ["3"])

    run_in_thread(work, in_thread)
    assert results["spin"] is False and results["seconds"] < 5.0
    assert results["next"] is True and results["after"] == [1.0]


@pytest.mark.parametrize(
    ("completion", "gold", "right"),
    [
        ("so $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt3}{2}", True),
        ("$\\boxed{x^2 + 1}$", "x^2+1", True),
        ("$\\boxed{2\\pi}$", "2\\pi", True),
        ("$\\boxed{2}$", "2\\pi", False),  # the leading 2 of a bare 2\pi is not the answer
        ("$\\boxed{0.5}$", "$\\frac{1}{2}$", True),  # a delimited gold is read as it is
        ("$\\boxed{7}$", "\\boxed{7}", True),
        ("$\\boxed{\\frac{1}{2}}$", "\\(\\frac12\\)", True),  # delimited: read as written
        ("the answer is $\\boxed{18}$", "18 dollars", True),  # plain text: its number
    ],
)
def test_bare_latex_gold_answers_are_read_as_math(completion, gold, right):
    """Gold answers written as bare LaTeX, as competition datasets write them, are parsed."""
    assert verify_answer(completion, gold) is right
