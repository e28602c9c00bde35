"""Tests for grpo.rewards.combine: text reward callables as one RewardModel."""

from __future__ import annotations

import math
import time

import pytest
import torch
from threads import run_in_thread

from grpo.lm.completion import Completion
from grpo.protocols import validate_reward_model
from grpo.rewards.combine import RewardError, TextReward, split_states

STATES = [
    {"prompt": "2+2", "answer": "4"},
    {"prompt": "3+3", "answer": "6"},
    {"prompt": "hi", "answer": None, "topic": "chat"},
]
TEXTS = ["4", "7", "hello"]


def exact(prompts, completions, answer, **kwargs):
    """1 if the completion equals the answer; None where there is no answer."""
    return [None if a is None else float(c == a) for c, a in zip(completions, answer, strict=True)]


def length(prompts, completions):
    return [len(c) for c in completions]


def test_weighted_sum_skips_none_and_reports_each_function():
    """reward = Σ w_f r_f with None adding 0; per-function mean/std cover only where it applies."""
    reward = TextReward([exact, length], weights=[2.0, 0.5])
    assert reward.compute_rewards(STATES, TEXTS).tolist() == [2.5, 0.5, 2.5]
    m = reward.last_metrics
    assert m["rewards/exact/mean"] == 0.5 and m["rewards/exact/std"] == 0.5
    assert m["rewards/exact/applied_frac"] == pytest.approx(2 / 3)
    assert m["rewards/length/mean"] == pytest.approx(7 / 3)
    assert m["rewards/length/std"] == pytest.approx(
        math.sqrt(((1 - 7 / 3) ** 2 * 2 + (5 - 7 / 3) ** 2) / 3)
    )
    assert m["reward/positive_frac"] == 1.0
    validate_reward_model(reward)


def test_columns_reach_functions_that_ask_for_them():
    """**kwargs functions get every column (None where a row lacks it); others only what they name."""
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns, prompts=prompts, completions=completions)
        return [0.0] * len(prompts)

    TextReward([spy, length]).compute_rewards(STATES, TEXTS)
    assert seen["answer"] == ["4", "6", None] and seen["topic"] == [None, None, "chat"]
    assert seen["prompts"] == ["2+2", "3+3", "hi"] and seen["completions"] == TEXTS


def test_completion_records_are_scored_by_their_text():
    """Completion actions pass their text, not their token ids."""
    actions = [Completion(t, (1, 2), (3,), truncated=False, finished_by_eos=True) for t in TEXTS]
    assert TextReward({"len": length}).compute_rewards(STATES, actions).tolist() == [1.0, 1.0, 5.0]


def test_all_none_is_an_error_or_zero():
    """A sample no function applies to raises by default and scores 0 with all_none='zero'."""
    with pytest.raises(ValueError, match="returned None for sample 2 \\(prompt 'hi'\\)"):
        TextReward(exact).compute_rewards(STATES, TEXTS)
    assert TextReward(exact, all_none="zero").compute_rewards(STATES, TEXTS).tolist() == [
        1.0,
        0.0,
        0.0,
    ]


def test_a_raising_function_is_named_with_its_sample():
    """An exception names the function, the first failing sample and its prompt."""

    def picky(prompts, completions, **_):
        return [1.0 / (c != "7") for c in completions]  # ZeroDivisionError on "7"

    with pytest.raises(
        RewardError, match="'picky' raised on sample 1 \\(prompt '3\\+3'\\): ZeroDivisionError"
    ) as info:
        TextReward(picky).compute_rewards(STATES, TEXTS)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    line = picky.__code__.co_firstlineno + 1
    assert str(info.value).endswith(f" at {__file__}:{line}")  # where it raised


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, float("nan"), 0.0], "'bad' returned nan for sample 1"),
        ([1.0, 2.0], "'bad' returned 2 values for 3 samples"),
        ([1.0, "x", 0.0], "'bad' returned str 'x' for sample 1 \\(prompt '3\\+3'\\)"),
        (0.5, "'bad' returned float"),
    ],
)
def test_bad_reward_values_are_errors(values, message):
    """NaN/inf, a wrong length, or a non-number is a RewardError naming function and sample."""

    def bad(prompts, completions, **_):
        return values

    with pytest.raises(RewardError, match=message):
        TextReward(bad).compute_rewards(STATES, TEXTS)


def test_bad_configuration_is_rejected():
    """Duplicate names, mismatched weights, non-finite weights and clashing columns are errors."""
    with pytest.raises(ValueError, match="two reward functions are named 'length'"):
        TextReward([length, length])
    with pytest.raises(ValueError, match="weights: got 1 for 2"):
        TextReward([length, exact], weights=[1.0])
    with pytest.raises(ValueError, match="weight of 'length': got inf"):
        TextReward(length, weights=[float("inf")])
    with pytest.raises(ValueError, match="column 'completions' clashes"):
        split_states([{"prompt": "a", "completions": 1}])


def needs_answer(prompts, completions, answer, *, unit="", **columns):
    return [float(c == f"{a}{unit}") for c, a in zip(completions, answer, strict=True)]


def test_required_columns_are_checked_on_rows_and_on_samples():
    """A row or sample lacking a column a function requires is named before the function runs."""
    reward = TextReward([needs_answer, length])
    assert reward.required == {"needs_answer": ("answer",), "length": ()}
    reward.check_rows(STATES)  # "answer": None is present, so it passes
    rows = [{"prompt": "a", "answer": 1}, {"prompt": "b"}]
    with pytest.raises(ValueError, match="^row 1: no column 'answer', which reward function "
                       "'needs_answer' requires \\(the row has \\['prompt'\\]\\)"):  # fmt: skip
        reward.check_rows(rows)
    with pytest.raises(ValueError, match="^row 0: column 'prompts' clashes"):
        reward.check_rows([{"prompt": "a", "prompts": 1}])
    with pytest.raises(RewardError, match="^sample 1 \\(prompt 'b'\\): no column 'answer'"):
        reward.compute_rewards(rows, ["1", "x"])


def test_a_function_that_cannot_take_the_contract_is_refused_at_once():
    """A reward function that cannot be called as f(prompts, completions, **columns) is refused."""

    def one_argument(completions):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="'one_argument' cannot be called as one_argument"):
        TextReward(one_argument)


def test_bare_prompts_are_states_too():
    """A str state is its own prompt and has no columns; rewards come back as float32 (N,)."""
    prompts, columns = split_states(["a", "b"])
    assert prompts == ["a", "b"] and columns == {}
    rewards = TextReward(length).compute_rewards(["a", "b"], ["xy", ""])
    assert rewards.dtype == torch.float32 and rewards.tolist() == [2.0, 0.0]


def spins_on_seven(prompts, completions, **_):
    """0 for every completion, after spinning in Python for up to 30 s on "7" (a hang)."""
    for completion in completions:
        deadline = time.monotonic() + 30.0
        while completion == "7" and time.monotonic() < deadline:
            pass
    return [0.0] * len(completions)


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_reward_that_hangs_is_one_error_naming_function_and_sample(in_thread):
    """A call past timeout_seconds is stopped, in the main thread or a sampling thread, and one
    RewardError names the function, the sample it hangs on alone, and its limit."""
    reward = TextReward([length, spins_on_seven], timeout_seconds=0.3)
    found = {}

    def work():
        begin = time.monotonic()
        try:
            reward.compute_rewards(STATES, TEXTS)
        except RewardError as err:
            found["error"] = str(err)
        found["seconds"] = time.monotonic() - begin

    run_in_thread(work, in_thread)
    assert found["seconds"] < 10.0  # the batch and one probe of 0.3 s each, not 30 s
    assert found["error"].startswith(
        "reward function 'spins_on_seven' ran longer than its 0.3 s on sample 1 (prompt '3+3')"
    )
    assert f"stopped at {__file__}:" in found["error"]
    assert TextReward(length, timeout_seconds=0.3).compute_rewards(STATES, TEXTS).tolist() == [
        1.0, 1.0, 5.0,
    ]  # fmt: skip


def test_a_timeout_must_be_a_positive_number_or_none():
    """timeout_seconds 0, a negative, inf or a string is refused by name; None turns it off."""
    for bad in (0, -1.0, float("inf"), "10"):
        with pytest.raises(ValueError, match="timeout_seconds: got"):
            TextReward(length, timeout_seconds=bad)
    assert TextReward(length, timeout_seconds=None).timeout_seconds is None
