"""Tests for grpo.tasks.arithmetic: problems, exact rewards, splits and difficulty."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo.tasks.arithmetic import (
    ArithmeticConfig,
    accuracy,
    evaluate,
    evaluate_expression,
    generate_dataset,
    problem_split,
    reward,
)


def test_reward_is_one_only_for_the_exact_answer():
    """Exact answer (whitespace aside) scores 1.0; near misses, extra digits and junk score 0.0."""
    completions = ["19", " 19\n", "18", "190", "1", "19=", "", "-19", "nineteen"]
    prompts = ["12+7="] * len(completions)
    scores = reward(prompts, completions, answer=["19"] * len(completions))
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_reward_handles_negative_answers_and_ignores_other_columns():
    """A negative answer must match with its sign; extra dataset columns are accepted and unused."""
    scores = reward(["3-10=", "3-10="], ["-7", "7"], answer=["-7", "-7"], difficulty=[1, 1])
    assert scores == [1.0, 0.0]


def test_reward_rejects_misaligned_or_non_text_input():
    """Length mismatches raise ValueError; chat-style completions raise TypeError naming the index."""
    with pytest.raises(ValueError, match="same length"):
        reward(["1+1="], ["2", "2"], answer=["2"])
    with pytest.raises(TypeError, match=r"completions\[0\]"):
        reward(["1+1="], [[{"role": "assistant", "content": "2"}]], answer=["2"])


def test_accuracy_and_evaluate_count_exact_matches():
    """accuracy is the share of exact answers; evaluate runs a generator over the rows."""
    assert accuracy(["2", "5", "4", "x"], ["2", "4", "4", "1"]) == 0.5
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    result = evaluate(lambda prompts: [str(evaluate_expression(p)) for p in prompts], rows)
    assert result == {"accuracy": 1.0, "num_problems": 2.0}
    assert evaluate(lambda prompts: ["0"] * len(prompts), rows)["accuracy"] == 0.0


@pytest.mark.parametrize(
    ("prompt", "value"),
    [("12+7=", 19), ("3+4*5=", 23), ("10-2*3*2+1=", -1), ("7-9=", -2), ("0*55=", 0)],
)
def test_evaluate_expression_uses_usual_precedence(prompt, value):
    """`*` binds tighter than `+` and `-`, which associate left to right."""
    assert evaluate_expression(prompt) == value


def test_dataset_is_deterministic_per_seed_and_answers_are_exact():
    """Same seed -> identical rows; another seed -> other rows; every answer is the true value."""
    config = ArithmeticConfig(num_operands=3, max_digits=2, operators=("+", "-", "*"))
    first = generate_dataset(200, seed=3, config=config)
    assert first == generate_dataset(200, seed=3, config=config)
    assert first != generate_dataset(200, seed=4, config=config)
    for row in first:
        expression = row["prompt"][:-1]
        assert row["answer"] == str(eval(expression))  # Python's own precedence as the oracle


def test_dataset_does_not_depend_on_the_interpreter_hash_seed():
    """The rows are the same in a fresh interpreter with another PYTHONHASHSEED."""
    code = (
        "from grpo.tasks.arithmetic import generate_dataset;"
        "print([r['prompt'] for r in generate_dataset(5, seed=1)])"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": "."},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1] == f"{[r['prompt'] for r in generate_dataset(5, seed=1)]}\n"


def test_train_and_held_out_never_share_a_problem_whatever_the_seeds():
    """No held-out prompt ever appears in a training set, for any pair of seeds."""
    held_out = {
        r["prompt"] for s in range(3) for r in generate_dataset(300, split="held_out", seed=s)
    }
    train = {r["prompt"] for s in range(3) for r in generate_dataset(3000, seed=s)}
    assert len(held_out) >= 300
    assert not held_out & train
    assert all(problem_split(p) == "held_out" for p in held_out)


def test_held_out_fraction_matches_the_share_of_all_problems():
    """Over every 2-number problem up to 2 digits, about held_out_fraction of them are held out."""
    prompts = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    share = sum(problem_split(p, 0.1) == "held_out" for p in prompts) / len(prompts)
    assert abs(share - 0.1) < 0.01


def test_unique_rows_are_distinct_and_too_many_is_an_error():
    """unique=True gives distinct prompts; asking for more than the split holds raises ValueError."""
    rows = generate_dataset(500, split="held_out", seed=0)
    assert len({r["prompt"] for r in rows}) == 500
    tiny = ArithmeticConfig(max_digits=1)  # 100 problems, about 10 held out
    with pytest.raises(ValueError, match="num_problems=50"):
        generate_dataset(50, split="held_out", config=tiny)
    assert len(generate_dataset(50, split="held_out", config=tiny, unique=False)) == 50


def test_difficulty_settings_shape_the_problems():
    """Operand count, digit range and operator set are exactly those configured."""
    config = ArithmeticConfig(num_operands=4, min_digits=3, max_digits=3, operators=("-", "*"))
    for row in generate_dataset(100, seed=0, config=config):
        body = row["prompt"][:-1]
        numbers = body.replace("-", " ").replace("*", " ").split()
        assert len(numbers) == 4
        assert all(len(n) == 3 for n in numbers)
        assert set(body) - set("0123456789") <= {"-", "*"}
    easy = generate_dataset(50, seed=0, config=ArithmeticConfig(max_digits=1))
    assert all(len(r["prompt"]) == 4 for r in easy)  # "a+b=" with one-digit operands


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("num_operands", 1, ">= 2"),
        ("min_digits", 0, r"\[1, 9\]"),
        ("max_digits", 10, r"\[1, 9\]"),
        ("operators", ("/",), "subset"),
        ("held_out_fraction", 1.0, r"\(0, 1\)"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value, allowed):
    """Each invalid setting raises ValueError naming the field, the value and what is allowed."""
    with pytest.raises(ValueError, match=f"{field}.*{allowed}"):
        ArithmeticConfig(**{field: value})


def test_config_rejects_min_digits_above_max_digits_and_bad_split():
    """min_digits > max_digits and an unknown split are refused with the values named."""
    with pytest.raises(ValueError, match=r"min_digits \(3\).*max_digits \(2\)"):
        ArithmeticConfig(min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match="split.*'test'"):
        generate_dataset(1, split="test")


def test_importing_the_task_does_not_import_torch_or_transformers():
    """The task module is importable without pulling in heavy libraries."""
    code = (
        "import sys, grpo.tasks.arithmetic;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": "."}, capture_output=True, text=True
    )
    assert out.stdout.strip() == "[]", out.stderr
