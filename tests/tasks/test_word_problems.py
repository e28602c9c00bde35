"""Tests for grpo.tasks.word_problems: problems, the three splits, value rewards, evaluation."""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.cli.tasks import build_task
from grpo.lm.prompt_forms import plain_text
from grpo.run.config_files import load_config
from grpo.run.structured import ConfigError
from grpo.tasks import hash_split
from grpo.tasks.word_problems import (
    EXAMPLE_PROBLEM,
    EXAMPLE_SOLUTION,
    HELD_OUT_TEMPLATES,
    INSTRUCTION,
    SPLITS,
    TEMPLATES,
    WordProblemsConfig,
    answer_alone,
    answer_format,
    breakdown,
    correct,
    correct_once,
    correct_strict,
    final_number,
    generate_dataset,
    stated_answer,
)


def problem_text(row: dict) -> str:
    return row["prompt"][-1]["content"]


def fold(equation: str) -> list[int]:
    """Every value of "7+5*3/2" applied left to right, written independently of the module."""
    tokens = re.findall(r"[-+*/]|\d+", equation)
    values = [int(tokens[0])]
    for op, number in zip(tokens[1::2], map(int, tokens[2::2]), strict=True):
        last = values[-1]
        if op == "/":
            assert last % number == 0, f"{equation}: {last} / {number} is not whole"
            values.append(last // number)
        else:
            values.append({"+": last + number, "-": last - number, "*": last * number}[op])
    return values


def literal_pieces(template: str) -> list[str]:
    """The fixed words of a template (its text between the {fields}), longest first."""
    return sorted((p.strip() for p in re.split(r"\{\w+\}", template) if p.strip()), key=len)[::-1]


def test_generation_is_deterministic_per_seed():
    """The same seed gives the same rows; another seed gives other rows."""
    for split in SPLITS:
        first = generate_dataset(30, split=split, seed=3)
        assert first == generate_dataset(30, split=split, seed=3)
        assert first != generate_dataset(30, split=split, seed=4)


def test_every_answer_is_the_positive_integer_the_story_computes():
    """The answer is the equation folded left to right; every count is a whole number in
    [1, max_value]; the story states the equation's numbers in its order."""
    config = WordProblemsConfig()
    for split in SPLITS:
        for row in generate_dataset(150, split=split, seed=1):
            values = fold(row["equation"])
            assert int(row["answer"]) == values[-1]
            assert all(1 <= v <= config.max_value for v in values)
            numbers = [int(n) for n in re.findall(r"\d+", row["equation"])]
            assert [int(n) for n in re.findall(r"\d+", problem_text(row))] == numbers
            assert row["operations"] == len(numbers) - 1


def test_held_out_phrasings_never_appear_outside_their_split():
    """Each held-out template's longest fixed phrase is in no training template, no train or
    heldout_numbers prompt; every heldout_phrasings prompt opens and asks in held-out words."""
    held = {kind: texts[-HELD_OUT_TEMPLATES:] for kind, texts in TEMPLATES.items()}
    training = [t for texts in TEMPLATES.values() for t in texts[:-HELD_OUT_TEMPLATES]]
    marks = [literal_pieces(t)[0] for texts in held.values() for t in texts]
    assert not any(mark in t for mark in marks for t in training)
    for split in ("train", "heldout_numbers"):
        for row in generate_dataset(200, split=split, seed=0):
            assert not any(mark in problem_text(row) for mark in marks)
    for row in generate_dataset(200, split="heldout_phrasings", seed=0):
        text = problem_text(row)
        for kind in ("start", "question"):
            assert any(literal_pieces(t)[0] in text for t in held[kind])


def test_bare_split_asks_the_held_out_story_alone():
    """A heldout_bare prompt is one user turn holding the story: no instruction, no worked
    example, no "Answer:" request; its story is told in held-out phrasings."""
    held = {kind: texts[-HELD_OUT_TEMPLATES:] for kind, texts in TEMPLATES.items()}
    rows = generate_dataset(100, split="heldout_bare", seed=0)
    for row in rows:
        (turn,) = row["prompt"]
        assert turn["role"] == "user" and "Answer" not in turn["content"]
        for kind in ("start", "question"):
            assert any(literal_pieces(t)[0] in turn["content"] for t in held[kind])
    told = {problem_text(r) for r in generate_dataset(100, split="heldout_phrasings", seed=0)}
    assert len(told & {problem_text(r) for r in rows}) < 10  # drawn apart, not a reformatting


def test_the_plain_form_writes_the_same_rows_as_question_and_answer_text():
    """prompt_form plain changes the prompt alone, into the chat prompt's plain_text: the
    instruction, the worked example as a Question/Answer pair, the problem, an open "Answer:";
    the bare split's prompt is the story as a lone question."""
    plain = WordProblemsConfig(prompt_form="plain")
    for split in SPLITS:
        chat = generate_dataset(20, split=split, seed=1)
        assert generate_dataset(20, split=split, seed=1, config=plain) == [
            {**row, "prompt": plain_text(row["prompt"])} for row in chat
        ]
    (row,) = generate_dataset(1, config=plain)
    story = problem_text(generate_dataset(1)[0])
    assert row["prompt"] == (
        f"{INSTRUCTION}\n\nQuestion: {EXAMPLE_PROBLEM}\nAnswer: {EXAMPLE_SOLUTION}\n\n"
        f"Question: {story}\nAnswer:"
    )
    (bare,) = generate_dataset(1, split="heldout_bare", config=plain)
    story = problem_text(generate_dataset(1, split="heldout_bare")[0])
    assert bare["prompt"] == f"Question: {story}\nAnswer:"


def test_hash_split_keeps_training_equations_out_of_every_held_out_split():
    """Train equations hash to train, held-out ones to held_out; the sets share no equation."""
    config = WordProblemsConfig()
    rows = {split: generate_dataset(300, split=split, seed=2) for split in SPLITS}
    train = {r["equation"] for r in rows["train"]}
    assert all(hash_split(e, config.held_out_fraction) == "train" for e in train)
    for split in SPLITS[1:]:
        held = {r["equation"] for r in rows[split]}
        assert all(hash_split(e, config.held_out_fraction) == "held_out" for e in held)
        assert not train & held


def test_operation_weights_set_the_mix():
    """Weight only on two operations gives only two-operation problems."""
    config = WordProblemsConfig(operation_weights=(0.0, 1.0))
    assert {r["operations"] for r in generate_dataset(50, config=config)} == {2}


def test_train_operation_weights_change_only_the_training_mix():
    """A training curriculum leaves both held-out splits row for row as they were, and the
    training split draws its counts from the curriculum's weights."""
    plain = WordProblemsConfig(operation_weights=(0.5, 0.5))
    curriculum = WordProblemsConfig(operation_weights=(0.5, 0.5), train_operation_weights=(1.0, 0.0))
    for split in SPLITS[1:]:
        assert generate_dataset(40, split=split, config=curriculum) == generate_dataset(
            40, split=split, config=plain
        )
    assert {r["operations"] for r in generate_dataset(50, config=curriculum)} == {1}
    assert {r["operations"] for r in generate_dataset(50, config=plain)} == {1, 2}


def test_the_smollm2_config_trains_on_one_and_two_step_stories(tiny_llama):
    """configs/smollm2_math.yaml trains on one-operation stories four times in five and
    two-operation ones otherwise, never three; with its curriculum set to null the training
    split draws three-operation stories again (the held-out splits never change with it: the
    test above)."""
    config_path = Path(__file__).resolve().parents[2] / "configs" / "smollm2_math.yaml"
    overrides = [f"model.path={tiny_llama}", "task.train_size=400", "task.eval_size=4",
                 "policy.precision=fp32"]  # fmt: skip

    def counts(*more):
        parts = build_task(load_config(config_path, [*overrides, *more]))
        return [sum(s["operations"] == k for s in parts.train_states) for k in (1, 2, 3)]

    one, two, three = counts()
    assert three == 0 and one + two == 400
    assert 0.74 < one / 400 < 0.86  # 0.8, within about three standard errors (0.02 each)
    assert counts("task.options.train_operation_weights=null")[2] > 40  # 0.2 of 400 expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"operation_weights": (0.0, 0.0)}, "operation_weights"),
        ({"train_operation_weights": (-1.0, 2.0)}, "train_operation_weights"),
        ({"operators": ("+", "^")}, "operators"),
        ({"max_factor": 1}, "max_factor"),
        ({"held_out_fraction": 1.0}, "held_out_fraction"),
        ({"prompt_form": "text"}, "prompt_form"),
    ],
)
def test_bad_settings_name_the_field(options, message):
    """A setting out of range raises a ValueError that names it."""
    with pytest.raises(ValueError, match=message):
        WordProblemsConfig(**options)


def test_numbers_are_read_as_whole_numbers():
    """The final number and the stated answer parse commas and .0; a fraction is no integer."""
    assert final_number("5 + 3 = 8, so 8 - 2 = 6 apples") == 6
    assert final_number("that makes 1,200.") == 1200
    assert final_number("it is 12.0") == 12
    assert final_number("about 12.5") is None
    assert final_number("no digits here") is None
    assert stated_answer("8 - 2 = 6\nAnswer: 6") == 6
    assert stated_answer("**Answer:** 14 marbles") == 14
    assert stated_answer("Answer: **-3**") == -3
    assert stated_answer("Answer: 12.5") is None
    assert stated_answer("The answer is 6") is None


def test_rewards_hand_checked():
    """Lenient: the last number; strict: the stated answer; format: any stated whole number."""
    completions = [
        "5 + 3 = 8.\nAnswer: 8",  # right, stated
        "She has 8 now.",  # right by value, not stated
        "Answer: 8. Check: 8 - 3 = 5",  # stated right, but the last number is 5
        "Answer: 7",  # wrong, stated
        "I do not know.",  # no number at all
    ]
    answers = ["8"] * len(completions)
    assert correct([], completions, answers) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert correct_strict([], completions, answers) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert answer_format([], completions) == [1.0, 0.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="same length"):
        correct([], ["8"], ["8", "9"])


def test_answer_once_scores_only_a_single_stated_answer_hand_checked():
    """once: the first "Answer: N" must be right and no number may follow it, so a reply that
    runs on after its answer, or changes it, scores 0 whatever its last number."""
    completions = [
        "5 + 3 = 8.\nAnswer: 8",  # right, stated once
        "5 + 3 = 8.\nAnswer: 8 stickers.\n\nQuestion:",  # the plain form's stop after it
        "5 + 3 = 8.\nAnswer: 8\nAnswer: 8\nAnswer: 8",  # right, but runs on
        "Answer: 7\nAnswer: 8",  # a second guess that the lenient check would take
        "Answer: 8. Check: 8 - 3 = 5",  # a number after the answer
        "She has 8 now.",  # right by value, never stated
        "Answer: 7",  # stated once, wrong
    ]
    answers = ["8"] * len(completions)
    assert correct_once([], completions, answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert correct([], completions, answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert [answer_alone(c) for c in completions] == [8, 8, None, None, None, None, 7]
    with pytest.raises(ValueError, match="same length"):
        correct_once([], ["Answer: 8"], ["8", "9"])
    with pytest.raises(TypeError, match=r"completions\[0\]"):
        correct_once([], [8], ["8"])


def test_answer_check_once_sets_the_training_reward_not_the_held_out_accuracy(
    tmp_path, tiny_llama
):
    """answer_check picks the reward's `correct`; the held-out accuracy stays the lenient
    check (breakdown) whichever is picked."""
    path = config_file(tmp_path, tiny_llama)
    parts = build_task(load_config(path, ["task.options.answer_check=once"]))
    assert parts.reward.functions["correct"] is correct_once
    rows = [{"answer": 8, "equation": "5+3", "operations": 1}]
    assert breakdown(rows, ["Answer: 7\nAnswer: 8"])["accuracy"] == 1.0


def test_breakdown_reports_strict_and_lenient_by_operation_count():
    """Per-count accuracies are the shares of their own rows, hand-counted; the standard error
    is clustered by equation (two rows share "1+2")."""
    rows = [
        {"answer": "3", "operations": 1, "equation": "1+2"},
        {"answer": "4", "operations": 1, "equation": "2+2"},
        {"answer": "5", "operations": 2, "equation": "1+2"},
    ]
    metrics = breakdown(rows, ["Answer: 3", "so 4", "Answer: 6"])
    # lenient [1, 1, 0], mean 2/3; cluster sums of deviations: "1+2" 1/3 - 2/3 = -1/3, "2+2"
    # 1/3; variance 2 / (2 - 1) * (1/9 + 1/9) / 3^2 = 4/81
    assert metrics["accuracy"] == pytest.approx(2 / 3) and metrics["num_equations"] == 2.0
    assert metrics["accuracy_se"] == pytest.approx(2 / 9, rel=1e-12)
    assert metrics["accuracy_strict"] == pytest.approx(1 / 3)
    assert metrics["answer_format"] == pytest.approx(2 / 3)
    assert metrics["accuracy_ops1"] == 1.0 and metrics["accuracy_strict_ops1"] == 0.5
    assert metrics["accuracy_ops2"] == 0.0 and metrics["num_problems_ops2"] == 1.0


# ---- through the command line, on a tiny model ----


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama with a context long enough for chat prompts spelt in bytes."""
    from tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama"), "llama", max_positions=1024)


def config_file(tmp_path: Path, model: Path) -> str:
    path = tmp_path / "word.yaml"
    path.write_text(
        textwrap.dedent(f"""
        model: {{path: {model}, device: cpu, use_reference: false}}
        task: {{name: word_problems, train_size: 8, eval_size: 3, options: {{format_weight: 0.1}}}}
        prompts_per_step: 2
        grpo: {{group_size: 2, batch_size: 4, kl_coeff: 0.0}}
        rollout: {{engine: lean}}
        policy: {{generation: {{max_new_tokens: 3}}}}
        evaluation: {{modes: [greedy]}}
        run: {{threads: 1}}
    """)
    )
    return str(path)


def test_eval_and_sample_commands_run_the_task(tmp_path, tiny_llama, capsys):
    """`grpo eval` prints both held-out splits and their pool; `grpo sample` prints completions."""
    path = config_file(tmp_path, tiny_llama)
    assert main(["eval", path]) == 0
    out = capsys.readouterr().out
    for prefix in (
        "eval/heldout_numbers/greedy/",
        "eval/heldout_phrasings/greedy/",
        "eval/greedy/",
    ):
        assert f"{prefix}accuracy " in out and f"{prefix}accuracy_strict " in out
    assert "split: heldout_phrasings" in out
    assert main(["sample", path, "--num-prompts", "1", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("  -> ") == 2 and "'role': 'user'" in out


def test_pooled_evaluation_weights_each_split_by_its_problems(tmp_path, tiny_llama):
    """With a policy answering every problem right in the stated form, every accuracy is 1;
    with one answering "Answer: 0", every accuracy is 0 and the format rate 1; with one right
    on one-step problems alone, the pooled accuracy, distinct equations and clustered standard
    error are those of every split's rows taken together."""
    from grpo.tasks import clustered_standard_error

    config = load_config(config_file(tmp_path, tiny_llama), ["task.eval_size=4"])
    parts = build_task(config)

    def answering(right):
        def generate_actions(states, k, **_):
            return [[f"Answer: {s['answer'] if right(s) else 0}"] * k for s in states]

        return generate_actions

    parts.policy.generate_actions = answering(lambda s: True)
    metrics, _ = parts.evaluate()
    for prefix in ("eval/greedy/", *(f"eval/{split}/greedy/" for split in SPLITS[1:])):
        assert metrics[f"{prefix}accuracy"] == 1.0 and metrics[f"{prefix}accuracy_strict"] == 1.0
    counts = [metrics[k] for k in metrics if k.startswith("eval/greedy/num_problems_ops")]
    assert sum(counts) == 4.0 * len(SPLITS[1:])
    parts.policy.generate_actions = answering(lambda s: False)
    metrics, _ = parts.evaluate()
    assert metrics["eval/greedy/accuracy"] == 0.0 and metrics["eval/greedy/answer_format"] == 1.0
    assert metrics["eval/greedy/rewards/answer_format/mean"] == 1.0
    parts.policy.generate_actions = answering(lambda s: s["operations"] == 1)
    metrics, _ = parts.evaluate()
    rows = [r for split in SPLITS[1:] for r in generate_dataset(4, split=split, seed=0)]
    right = [float(r["operations"] == 1) for r in rows]
    equations = [r["equation"] for r in rows]
    assert metrics["eval/greedy/accuracy"] == pytest.approx(sum(right) / len(right))
    assert metrics["eval/greedy/num_equations"] == len(set(equations))
    assert metrics["eval/greedy/accuracy_se"] == pytest.approx(
        clustered_standard_error(right, equations), rel=1e-12
    )


def test_answer_check_option_is_checked(tmp_path, tiny_llama, monkeypatch):
    """An unknown answer_check is refused by name; math_verify without its package says how to
    install it."""
    path = config_file(tmp_path, tiny_llama)
    with pytest.raises(ConfigError, match="answer_check"):
        build_task(load_config(path, ["task.options.answer_check=regex"]))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: None if name == "math_verify" else real_find_spec(name, *a),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"grpo\[math\]"):
        build_task(load_config(path, ["task.options.answer_check=math_verify"]))
