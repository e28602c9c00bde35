"""Tests for grpo.rewards.math: math-verify answers, main thread and worker threads."""

import threading

import pytest

pytest.importorskip("math_verify")

from grpo.rewards.math import in_main_thread, math_answer_reward, verify_answer  # noqa: E402

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
    assert in_main_thread()
    assert math_answer_reward([""] * 5, COMPLETIONS, ANSWERS) == EXPECTED


def test_math_reward_from_a_worker_thread():
    """Outside the main thread (where signal.alarm raises) the reward still gives the same values."""
    results = {}

    def work():
        results["main"] = in_main_thread()
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
