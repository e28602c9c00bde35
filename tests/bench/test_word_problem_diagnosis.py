"""bench/word_problem_diagnosis.py, its cells (word_problem_cells.py) and their tables
(word_problem_results.py): cells hand-computed on fixed replies, replies that are the task's own
evaluation's, and the tables a record renders to."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import render_results  # noqa: E402
import word_problem_diagnosis as diagnosis  # noqa: E402
import word_problem_results  # noqa: E402
from evaluate_checkpoints import load_checkpoint  # noqa: E402
from word_problem_cells import cells, changes, example_overlap, groups, tabulate  # noqa: E402

from grpo.lm.prompt_forms import plain_text  # noqa: E402
from grpo.tasks.word_problems import WordProblemsConfig, generate_dataset  # noqa: E402

# ---- the cells, by hand ----
ROWS = [  # two share the equation "7+5"
    {"answer": "12", "equation": "7+5"},  # 1 step, +, largest 12
    {"answer": "4", "equation": "8/2"},  # 1 step, /, largest 8
    {"answer": "12", "equation": "7+5"},
    {"answer": "36", "equation": "7+5*3"},  # 2 steps, last *, largest 36 (12 * 3)
]
REPLIES = [
    "7 + 5 = 12\nAnswer: 12",  # right, stated
    "Answer: 6",  # wrong, stated, the worked example's answer
    "so 12",  # right, not stated
    "Mia starts with 5. After buying 3 more she has 36",  # right; the example's wording
]


def test_groups_follow_the_computation():
    """The largest number counts intermediate counts and the answer, not only the operands."""
    assert groups("7+5*3") == ("all", "steps 2", "last op *", "largest >=20")  # 12, then 36
    assert groups("8/2") == ("all", "steps 1", "last op /", "largest <10")
    assert groups("9+1") == ("all", "steps 1", "last op +", "largest 10-19")  # the answer 10
    assert groups("6*3/2") == ("all", "steps 2", "last op /", "largest 10-19")  # 18, then 9
    assert groups("10-3") == ("all", "steps 1", "last op -", "largest 10-19")  # the operand 10


def test_example_overlap_counts_the_examples_word_pairs():
    """Words mia starts with after buying more she has: 6 of their 7 pairs are the example's
    (all but "with after"); digits and punctuation are no words; one word has no pair."""
    assert example_overlap(REPLIES[3]) == pytest.approx(6 / 7, rel=1e-12)
    assert example_overlap("Answer: 12") == 0.0 and example_overlap("") == 0.0


def test_cells_by_hand():
    """Accuracy [1, 0, 1, 1], strict [1, 0, 0, 0], format [1, 1, 0, 0] over the equations
    7+5, 8/2, 7+5, 7+5*3; standard errors clustered: sqrt(C / (C - 1) * sum_c (sum of the
    cluster's deviations)^2) / n."""
    table = cells(ROWS, REPLIES)
    assert list(table) == ["all", "steps 1", "steps 2", "last op +", "last op *", "last op /",
                           "largest <10", "largest 10-19", "largest >=20"]  # fmt: skip
    every = table["all"]
    assert (every["n"], every["equations"], every["stated"]) == (4, 3, 2)
    assert every["accuracy"] == 0.75
    # deviations 0.25, -0.75, 0.25, 0.25: cluster sums 0.5, -0.75, 0.25; squares 0.875
    assert every["accuracy_se"] == pytest.approx(math.sqrt(1.5 * 0.875) / 4, rel=1e-12)
    # deviations 0.75, -0.25, -0.25, -0.25: cluster sums 0.5, -0.25, -0.25; squares 0.375
    assert (every["strict"], every["strict_se"]) == (0.25, pytest.approx(0.1875, rel=1e-12))
    assert every["format"] == 0.5
    # stated: replies 0 and 1, strict 1 and 0 over two equations: (2 * 0.5) ** 0.5 / 2
    assert (every["right_when_stated"], every["right_when_stated_se"]) == (0.5, 0.5)
    assert every["example_overlap"] == pytest.approx(6 / 7 / 4, rel=1e-12)
    assert every["example_answer"] == 0.25  # reply 1 ends on 6, the answer is 4
    one = table["steps 1"]  # accuracy [1, 0, 1]: cluster sums 2/3, -2/3
    assert (one["n"], one["accuracy"]) == (3, pytest.approx(2 / 3, rel=1e-12))
    assert one["accuracy_se"] == pytest.approx(4 / 9, rel=1e-12)
    two = table["steps 2"]  # one problem: no spread, nothing stated
    assert (two["accuracy"], two["accuracy_se"], two["stated"]) == (1.0, None, 0)
    assert two["right_when_stated"] is None and two["example_overlap"] == pytest.approx(6 / 7)
    plus = table["last op +"]  # two problems of one equation: no clustered error
    assert (plus["n"], plus["equations"], plus["accuracy"], plus["strict"]) == (2, 1, 1.0, 0.5)
    assert plus["accuracy_se"] is None
    assert [table[f"largest {s}"]["n"] for s in ("<10", "10-19", ">=20")] == [1, 2, 1]


def test_changes_are_paired_problem_by_problem():
    """After "Answer: 12" everywhere: accuracy [1, 0, 1, 0] against [1, 0, 1, 1], a change of
    [0, 0, 0, -1] (mean -0.25; cluster sums 0.5, 0.25, -0.75); strict +[0, 0, 1, 0]; format
    +[0, 0, 1, 1]."""
    change = changes(ROWS, REPLIES, ["Answer: 12"] * 4)
    every = change["all"]
    assert every["n"] == 4 and every["accuracy"] == -0.25
    assert every["strict"] == 0.25 and every["format"] == 0.5
    assert every["accuracy_se"] == pytest.approx(math.sqrt(1.5 * 0.875) / 4, rel=1e-12)
    assert change["last op *"]["accuracy"] == -1.0 and change["last op *"]["accuracy_se"] is None


def test_tabulate_pools_the_splits_and_compares_with_the_first_model():
    """The pooled cell is the cell of every split's rows together; changes exist for the later
    models only, each against the first."""
    rows = {"a": ROWS[:2], "b": ROWS[2:]}
    replies = {
        "before": {"a": {"full": REPLIES[:2]}, "b": {"full": REPLIES[2:]}},
        "later": {"a": {"full": ["12", "4"]}, "b": {"full": ["12", "36"]}},
    }
    found = tabulate(rows, replies)
    assert found["cells"]["before"]["pooled"]["full"] == cells(ROWS, REPLIES)
    assert found["cells"]["before"]["a"]["full"] == cells(ROWS[:2], REPLIES[:2])
    assert list(found["changes"]) == ["later"]
    assert found["changes"]["later"]["pooled"]["full"] == changes(
        ROWS, REPLIES, ["12", "4", "12", "36"]
    )


def test_prompt_forms_are_the_tasks_own_prompts():
    """The full form asks a held-out problem as its split does, the bare form as the bare split
    does; without the example the instruction stays; the example alone drops it."""
    numbers = generate_dataset(3, split="heldout_numbers")
    bare = generate_dataset(3, split="heldout_bare")
    assert diagnosis.with_form(numbers, "full") == numbers
    assert diagnosis.with_form(bare, "bare") == bare
    full = diagnosis.with_form(bare, "full")[0]["prompt"]
    assert diagnosis.with_form(bare, "no_example")[0]["prompt"] == [full[0], full[-1]]
    assert diagnosis.with_form(bare, "example_only")[0]["prompt"] == full[1:]


def test_prompt_forms_follow_the_configs_plain_form():
    """In the plain form each form is its chat messages as plain text: the full form is the
    plain task's own prompt, the bare form the plain bare split's."""
    plain = WordProblemsConfig(prompt_form="plain")
    numbers = generate_dataset(3, split="heldout_numbers")
    bare = generate_dataset(3, split="heldout_bare")
    assert diagnosis.with_form(numbers, "full", "plain") == generate_dataset(
        3, split="heldout_numbers", config=plain
    )
    assert diagnosis.with_form(bare, "bare", "plain") == generate_dataset(
        3, split="heldout_bare", config=plain
    )
    no_example = diagnosis.with_form(bare, "no_example", "plain")[0]["prompt"]
    assert no_example == plain_text(diagnosis.with_form(bare, "no_example")[0]["prompt"])


# ---- end to end, on a tiny model ----
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama with a context long enough for chat prompts spelt in bytes."""
    from tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama"), "llama", max_positions=1024)


def _checkpoints(tmp_path: Path, model: Path) -> tuple[str, Path, Path]:
    """A config, the checkpoint of its one-step run, and a copy of it with other weights."""
    import torch

    from grpo.cli import main as grpo
    from grpo.run.rundir import RunDirectory, read_checkpoint

    run = tmp_path / "run"
    config = tmp_path / "word.yaml"
    config.write_text(textwrap.dedent(f"""
        model: {{path: {model}, device: cpu, use_reference: false}}
        task: {{name: word_problems, train_size: 8, eval_size: 3}}
        prompts_per_step: 2
        grpo: {{group_size: 2, batch_size: 4, kl_coeff: 0.0}}
        rollout: {{engine: lean}}
        policy: {{generation: {{max_new_tokens: 3}}}}
        schedule: {{num_steps: 1}}
        evaluation: {{modes: [greedy], num_logged_samples: 3}}
        run: {{threads: 1, dir: {run}, checkpoint_every: 1}}
    """))  # fmt: skip
    assert grpo(["train", str(config)]) == 0
    state = read_checkpoint(run / "checkpoints" / "step-000001")
    torch.manual_seed(0)
    for tensor in state["trainer"]["policy"].values():
        if tensor.is_floating_point():
            tensor.add_(torch.randn_like(tensor))
    other = RunDirectory(run).save_checkpoint(2, state, keep=10)
    return str(config), run / "checkpoints" / "step-000001", other


def test_the_script_measures_what_the_tasks_evaluation_measures(tmp_path, tiny_llama):
    """Before and after each checkpoint, the full form's replies are the task's own greedy
    evaluation's, reply by reply; other weights reply otherwise; every reply and the record
    are written, with one cell of n problems per split, form and model."""
    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config

    config, step_1, step_2 = _checkpoints(tmp_path, tiny_llama)
    argv = [config, "--after", str(step_1), str(step_2), "--eval-size", "3",
            "--completions", str(tmp_path / "replies.jsonl"), "--record", "probe",
            "--results", str(tmp_path / "results")]  # fmt: skip
    results = diagnosis.main(argv)
    assert [m["label"] for m in results["models"]] == ["before", "step 1", "step 2"]
    assert results["generations"] == 3 * 2 * 3 * 3
    lines = [json.loads(line) for line in (tmp_path / "replies.jsonl").read_text().splitlines()]
    assert len(lines) == results["generations"]
    replies = {}
    for line in lines:
        replies.setdefault((line["model"], line["split"], line["form"]), []).append(
            line["completion"]
        )
    parts = build_task(load_config(config, []))
    for model, folder in (("before", None), ("step 2", step_2)):
        if folder is not None:
            load_checkpoint(parts.policy, folder)
        _, samples = parts.evaluate()
        for split in diagnosis.DEFAULT_SPLITS:
            own = [s["completion"] for s in samples if s["split"] == split]
            assert replies[(model, split, "full")] == own, (model, split)
    assert any(replies[("before", *key[1:])] != texts
               for key, texts in replies.items() if key[0] == "step 2")  # fmt: skip
    record = json.loads((tmp_path / "results" / "probe.json").read_text())
    assert record["command"].startswith("python bench/word_problem_diagnosis.py ")
    assert record["results"] == json.loads(json.dumps(results))
    for model in ("before", "step 1", "step 2"):
        for split in (*diagnosis.DEFAULT_SPLITS, "pooled"):
            for form in diagnosis.DEFAULT_FORMS:
                n = results["cells"][model][split][form]["all"]["n"]
                assert n == (6 if split == "pooled" else 3)


def test_a_plain_form_config_is_asked_in_plain_text(tmp_path):
    """A base model's config (prompt_form: plain, no chat template): the script runs, and the
    full form's replies are the task's own greedy evaluation's, reply by reply."""
    from tiny_models import build_tiny_causal_lm

    from grpo.cli.tasks import build_task
    from grpo.run.config_files import load_config

    model = build_tiny_causal_lm(tmp_path / "gemma3", "gemma3", max_positions=1024)
    config = tmp_path / "plain.yaml"
    config.write_text(textwrap.dedent(f"""
        model: {{path: {model}, device: cpu, use_reference: false}}
        task: {{name: word_problems, train_size: 8, eval_size: 2, options: {{prompt_form: plain}}}}
        grpo: {{kl_coeff: 0.0}}
        policy: {{generation: {{max_new_tokens: 3}}}}
        evaluation: {{modes: [greedy], num_logged_samples: 2}}
        run: {{threads: 1, dir: {tmp_path / "run"}}}
    """))  # fmt: skip
    results = diagnosis.main([str(config), "--eval-size", "2", "--completions",
                              str(tmp_path / "replies.jsonl")])  # fmt: skip
    assert results["generations"] == 1 * 2 * 3 * 2
    lines = [json.loads(line) for line in (tmp_path / "replies.jsonl").read_text().splitlines()]
    _, samples = build_task(load_config(str(config), [])).evaluate()
    for split in diagnosis.DEFAULT_SPLITS:
        own = [s["completion"] for s in samples if s["split"] == split]
        asked = [x["completion"] for x in lines if (x["split"], x["form"]) == (split, "full")]
        assert asked == own, split


# ---- the tables ----
def _record(later: bool = True) -> dict:
    """Two splits of two problems (four distinct equations), full and bare forms; the later
    model answers every full prompt in the stated form and every bare one by its number."""
    problems = [("5", "2+3"), ("8", "4*2"), ("5", "9-4"), ("2", "6/3")]
    every = [{"answer": answer, "equation": equation} for answer, equation in problems]
    rows = {"heldout_numbers": every[:2], "heldout_phrasings": every[2:]}
    before = {"full": ["Answer: 5", "8", "Answer: 1", "so 2"], "bare": ["I think 7", "x", "y", "z"]}
    after = {
        "full": ["Answer: 5", "Answer: 8", "Answer: 5", "Answer: 2"],
        "bare": ["5", "8", "5", "2"],
    }

    def split(replies: dict[str, list[str]]) -> dict:
        return {"heldout_numbers": {f: r[:2] for f, r in replies.items()},
                "heldout_phrasings": {f: r[2:] for f, r in replies.items()}}  # fmt: skip

    replies = (
        {"before": split(before), "step 64": split(after)} if later else {"before": split(before)}
    )
    results = {"splits": list(rows), "forms": ["full", "bare"],
               "models": [{"label": label} for label in replies],
               **tabulate(rows, replies)}  # fmt: skip
    return {"name": word_problem_results.NAME, "results": results}


def test_tables_from_a_record_by_hand():
    """Pooled full form before: format [1, 0, 1, 0], strict [1, 0, 0, 0], final number
    [1, 1, 0, 1]; after, all right and stated. Four distinct equations: a standard error is
    s / sqrt(4); the change [0, 0, 1, 0] has 0.25 (sqrt(4/3 * 0.75) / 4)."""
    text = word_problem_results.render({word_problem_results.NAME: _record()},
                                       lambda *records: "SOURCE")  # fmt: skip
    for row in [
        "| all | full scaffold | 4 | 50.0 → 100.0 | 25.0 → 100.0 | 75.0 → 100.0 | +25.0 ± 25.0 |",
        "| all | bare question | 4 | 0.0 → 0.0 | 0.0 → 0.0 | 0.0 → 100.0 | +100.0 ± 0.0 |",
        "| new numbers | full scaffold | 2 | 50.0 → 100.0 | 50.0 → 100.0 | 100.0 → 100.0 | "
        "+0.0 ± 0.0 |",
        "| every problem | 4 | 75.0 → 100.0 (+25.0 ± 25.0) | 0.0 → 100.0 (+100.0 ± 0.0) |",
        "| last step + | 1 | 100.0 → 100.0 (+0.0) | 0.0 → 100.0 (+100.0) |",
        "| full scaffold | before | 50.0 ± 28.9 | 50.0 ± 50.0 (of 2) | 75.0 ± 25.0 | 0.0 ± 0.0 | "
        "0.0 ± 0.0 |",
    ]:
        assert row in text, row
    assert "new numbers: 2 problems of 2 distinct equations; unseen phrasings: 2" in text
    assert "(*full scaffold*: the instruction with its `Answer: N` request, one worked" in text
    assert text.endswith("SOURCE")


def test_a_record_of_the_model_before_alone_renders_its_figures():
    """Without a later model: no change columns, and each kind's accuracy with its error."""
    text = word_problem_results.render({word_problem_results.NAME: _record(later=False)},
                                       lambda *records: "SOURCE")  # fmt: skip
    assert "| all | full scaffold | 4 | 50.0 | 25.0 | 75.0 |" in text
    assert "| every problem | 4 | 75.0 ± 25.0 | 0.0 ± 0.0 |" in text
    assert "change at" not in text


def test_the_page_says_not_measured_until_the_record_exists():
    """Without the record the block names it instead of showing a number."""
    text = render_results.render_block("word-problem-diagnosis", {})
    assert (
        text.startswith("*Not measured yet") and "bench/results/word_problem_diagnosis.json" in text
    )
