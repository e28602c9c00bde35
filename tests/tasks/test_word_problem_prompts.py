"""Tests for grpo.tasks.word_problem_prompts: the forms a problem is asked in, the training
mix of them (`train_forms`), and configs/smollm2_math_forms.yaml."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml

from grpo.cli import main
from grpo.cli.tasks import build_task
from grpo.lm.prompt_forms import PLAIN_STOP, plain_text
from grpo.run.config_files import load_config
from grpo.run.structured import ConfigError
from grpo.tasks.word_problem_prompts import (
    FORMS,
    HELD_OUT_TEMPLATES,
    TEMPLATES,
    WORKED_EXAMPLES,
    check_train_forms,
    draw_forms,
    messages,
)
from grpo.tasks.word_problems import (
    EXAMPLE_PROBLEM,
    EXAMPLE_SOLUTION,
    INSTRUCTION,
    SPLITS,
    WordProblemsConfig,
    correct_once,
    generate_dataset,
)

REPO = Path(__file__).resolve().parents[2]
MIX = {"scaffold": 0.5, "instruction": 0.25, "bare": 0.25}

# sha256 (first 16 hex digits) of json.dumps(rows, sort_keys=True) of 200 rows at seed 0,
# written by the generator before train_forms existed: the default must keep them byte for byte
PINNED = {
    ("train", ()): "49847aa58de900b5",
    ("train", (("prompt_form", "plain"),)): "9927e710405aea55",
    ("train", (("worked_example", False),)): "5fa8b45a1192e4df",
    ("train", (("train_operation_weights", (0.8, 0.2, 0.0)),)): "295376756d1a1fc5",
    ("heldout_numbers", ()): "2383628b0d759ff0",
    ("heldout_phrasings", ()): "59cd2e548db1e2cd",
    ("heldout_bare", ()): "4086ab733d87db66",
}


def digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def form_of(prompt: list[dict]) -> str:
    """A chat prompt's form, read from its turns' roles alone."""
    roles = [turn["role"] for turn in prompt]
    return {("system", "user", "assistant", "user"): "scaffold", ("system", "user"): "instruction",
            ("user",): "bare"}[tuple(roles)]  # fmt: skip


def test_the_default_keeps_every_row_byte_for_byte():
    """Without train_forms, and with a mix that weighs only the scaffold, every split's rows
    hash as the generator wrote them before the option existed."""
    for (split, options), expected in PINNED.items():
        config = WordProblemsConfig(**dict(options))
        assert digest(generate_dataset(200, split=split, seed=0, config=config)) == expected
    for only_scaffold in ({"scaffold": 1.0}, {"bare": 0, "scaffold": 3}):
        config = WordProblemsConfig(train_forms=only_scaffold)
        assert digest(generate_dataset(200, seed=0, config=config)) == PINNED[("train", ())]


def test_the_held_out_splits_do_not_change_with_the_mix():
    """A training mix leaves every held-out split's rows byte for byte as pinned."""
    config = WordProblemsConfig(train_forms={"bare": 1.0})
    for split in SPLITS[1:]:
        assert (
            digest(generate_dataset(200, split=split, seed=0, config=config)) == PINNED[(split, ())]
        )


def test_each_form_asks_the_same_problem_as_documented():
    """Under a mix every row keeps the default row's problem, answer and columns; only its
    prompt differs: the scaffold's four turns, the instruction and the problem (no worked
    example), or the problem as one user turn (no request for "Answer: N")."""
    default = generate_dataset(120, seed=5)
    mixed = generate_dataset(120, seed=5, config=WordProblemsConfig(train_forms=MIX))
    assert {form_of(row["prompt"]) for row in mixed} == set(FORMS)
    for before, row in zip(default, mixed, strict=True):
        assert {**row, "prompt": None} == {**before, "prompt": None}
        story = before["prompt"][-1]["content"]
        expected = {
            "scaffold": [{"role": "system", "content": INSTRUCTION},
                         {"role": "user", "content": EXAMPLE_PROBLEM},
                         {"role": "assistant", "content": EXAMPLE_SOLUTION},
                         {"role": "user", "content": story}],
            "instruction": [{"role": "system", "content": INSTRUCTION},
                            {"role": "user", "content": story}],
            "bare": [{"role": "user", "content": story}],
        }[form_of(row["prompt"])]  # fmt: skip
        assert row["prompt"] == expected and "Answer" not in story
    no_example = WordProblemsConfig(train_forms={"scaffold": 1.0}, worked_example=False)
    assert {form_of(r["prompt"]) for r in generate_dataset(20, config=no_example)} == {
        "instruction"
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forms_come_in_their_weights_proportions(seed):
    """Over 2000 training rows each form's share is its weight over the sum within four
    binomial standard errors (sqrt(p (1 - p) / 2000): 0.011 at 1/2, 0.0097 at 1/4); a form
    weighted 0 never appears."""
    n, weights = 2000, {"scaffold": 2.0, "instruction": 1.0, "bare": 1.0}  # = MIX, unnormalised
    rows = generate_dataset(n, seed=seed, config=WordProblemsConfig(train_forms=weights))
    forms = [form_of(row["prompt"]) for row in rows]
    for form, p in MIX.items():
        assert abs(forms.count(form) / n - p) < 4 * math.sqrt(p * (1 - p) / n), form
    drawn = draw_forms(
        n, seed, check_train_forms({"scaffold": 0.0, "instruction": 0.9, "bare": 0.1})
    )
    assert "scaffold" not in drawn
    assert abs(drawn.count("bare") / n - 0.1) < 4 * math.sqrt(0.1 * 0.9 / n)


def test_forms_are_drawn_from_the_seed_alone():
    """The same seed gives the same rows, whatever order the config writes the weights in, and
    a longer draw begins with the shorter one; another seed asks other rows in other forms."""
    config = WordProblemsConfig(train_forms=MIX)
    reordered = WordProblemsConfig(train_forms=dict(reversed(MIX.items())))
    first = generate_dataset(100, seed=3, config=config)
    assert first == generate_dataset(100, seed=3, config=reordered)
    assert first[:40] == generate_dataset(40, seed=3, config=config)
    assert draw_forms(100, 3, config.train_forms) != draw_forms(100, 4, config.train_forms)


def test_the_plain_form_writes_every_training_form_as_text():
    """prompt_form plain with a mix: each row's prompt is plain_text of its chat prompt, the
    bare form a lone question and the instruction form the instruction before it."""
    chat = generate_dataset(60, seed=1, config=WordProblemsConfig(train_forms=MIX))
    plain = generate_dataset(
        60, seed=1, config=WordProblemsConfig(train_forms=MIX, prompt_form="plain")
    )
    assert plain == [{**row, "prompt": plain_text(row["prompt"])} for row in chat]
    for row, text in zip(chat, plain, strict=True):
        story = row["prompt"][-1]["content"]
        if form_of(row["prompt"]) == "bare":
            assert text["prompt"] == f"Question: {story}\nAnswer:"
        elif form_of(row["prompt"]) == "instruction":
            assert text["prompt"] == f"{INSTRUCTION}\n\nQuestion: {story}\nAnswer:"


@pytest.mark.parametrize(
    ("train_forms", "message"),
    [
        ({"scaffold": 1.0, "plain": 1.0}, r"train_forms: unknown form 'plain'; allowed: scaffold, instruction, bare"),
        ({"bare": -0.5, "scaffold": 1.0}, r"train_forms.bare must be a number >= 0, got -0.5"),
        ({"bare": True}, r"train_forms.bare must be a number >= 0, got True"),
        ({"bare": "0.5"}, r"train_forms.bare must be a number >= 0"),
        ({"bare": float("nan")}, r"train_forms.bare must be a number >= 0"),
        ({"scaffold": 0.0, "bare": 0}, r"train_forms must give some form a positive weight"),
        ({}, r"train_forms must map forms \(scaffold, instruction, bare\) to weights"),
        (["bare"], r"train_forms must map forms"),
    ],
)  # fmt: skip
def test_bad_train_forms_name_the_field(train_forms, message):
    """An unknown form, a weight that is not a finite number >= 0, or no positive weight: a
    ValueError naming train_forms (and the form)."""
    with pytest.raises(ValueError, match=message):
        WordProblemsConfig(train_forms=train_forms)


def test_a_bad_mix_is_refused_by_the_task_before_a_model_loads(tmp_path):
    """Through the config: a ConfigError naming task.options and train_forms, raised before the
    model (here a folder with none) would load."""
    config = REPO / "configs" / "smollm2_math_forms.yaml"
    with pytest.raises(ConfigError, match=r"task.options: train_forms: unknown form 'chat'"):
        build_task(
            load_config(config, [f"model.path={tmp_path}", "task.options.train_forms.chat=1"])
        )


def flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_forms_config_differs_from_smollm2_math_only_in_its_training_forms():
    """configs/smollm2_math_forms.yaml is configs/smollm2_math.yaml with train_forms added
    (scaffold weighted, and some unscaffolded form) and its own run directory: nothing else
    that trains or evaluates differs, so the two compare fairly."""
    base = flat(yaml.safe_load((REPO / "configs" / "smollm2_math.yaml").read_text()))
    forms = flat(yaml.safe_load((REPO / "configs" / "smollm2_math_forms.yaml").read_text()))
    differing = {k for k in base.keys() | forms.keys() if base.get(k, "absent") != forms.get(k)}
    assert {k.rsplit(".", 1)[0] if ".train_forms." in k else k for k in differing} == {
        "task.options.train_forms", "run.dir"}  # fmt: skip
    assert "task.options.train_forms" not in base and forms["run.dir"] != base["run.dir"]
    mix = check_train_forms(yaml.safe_load((REPO / "configs" / "smollm2_math_forms.yaml")
                                           .read_text())["task"]["options"]["train_forms"])  # fmt: skip
    assert mix["scaffold"] > 0 and mix.get("instruction", 0) + mix.get("bare", 0) > 0


# ---- the config on a tiny chat model ----


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama with a chat template and a context long enough for the prompts."""
    from tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("llama"), "llama", max_positions=1024)


TINY = {
    "task.train_size": 16, "task.eval_size": 1, "prompts_per_step": 2, "grpo.group_size": 2,
    "grpo.batch_size": 4, "grpo.gradient_accumulation_steps": 1, "policy.micro_batch_size": 4,
    "policy.generation.max_new_tokens": 4, "policy.precision": "fp32", "schedule.num_steps": 1,
    "evaluation.every": 1, "evaluation.batch_size": 4, "run.threads": 1, "run.tensorboard": False,
}  # fmt: skip


def test_one_grpo_step_of_the_forms_config_on_a_tiny_chat_model(tiny_llama, tmp_path):
    """configs/smollm2_math_forms.yaml at a tiny size: its training states are asked in the
    forms draw_forms gives the seed, every form rewarded alike ("Answer: N" right 1.1, the
    number alone 1, "Answer: 0" 0.1, the bare rows included); `grpo train` runs one step and
    records the mix; with prompt_form plain the same forms are written as text."""
    config = REPO / "configs" / "smollm2_math_forms.yaml"
    run = tmp_path / "run"
    overrides = [f"{k}={v}" for k, v in {**TINY, "model.path": tiny_llama, "run.dir": run}.items()]
    parts = build_task(load_config(config, overrides))
    forms = [form_of(state["prompt"]) for state in parts.train_states]
    assert forms == draw_forms(16, 0, MIX) and set(forms) == set(FORMS)
    for form in FORMS:
        state = parts.train_states[forms.index(form)]
        answer = state["answer"]
        texts = [f"so\nAnswer: {answer}", f"it is {answer}", "Answer: 0"]
        rewards = parts.reward.compute_rewards([state] * 3, texts).tolist()
        assert rewards == pytest.approx([1.1, 1.0, 0.1], rel=1e-6), form
    assert main(["train", str(config), *[a for o in overrides for a in ("--set", o)]]) == 0
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["task"]["options"]["train_forms"] == MIX
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1]
    plain = build_task(load_config(config, [*overrides, "task.options.prompt_form=plain"]))
    assert plain.policy.settings.generation.stop_strings == (PLAIN_STOP,)
    assert [s["prompt"] for s in plain.train_states] == [
        plain_text(s["prompt"]) for s in parts.train_states
    ]


def test_worked_example_story_is_true_and_one_step_shows_its_own_example():
    """worked_example "story" gives true's rows byte for byte; "one_step" changes only the
    scaffold's example turns, to a one-operation story told in training phrasings whose
    answer, its equation alone, scores 1 under the strictest check (answer_check once)."""
    story = WordProblemsConfig(worked_example="story")
    assert digest(generate_dataset(200, seed=0, config=story)) == PINNED[("train", ())]
    problem, answer = WORKED_EXAMPLES["one_step"]
    fields = {"name": "Mia", "objects": "stickers"}
    told = [
        TEMPLATES["start"][0].format(n=5, **fields),
        TEMPLATES["+"][0].format(n=3, **fields),
        TEMPLATES["question"][0].format(**fields),
    ]
    assert problem == " ".join(told)
    for kind in ("start", "+", "question"):  # phrasing 0 is not among the held-out last ones
        assert len(TEMPLATES[kind]) - HELD_OUT_TEMPLATES > 0
    assert correct_once([None], [" " + answer], ["8"]) == [1.0]
    default = generate_dataset(30, seed=2)
    one_step = generate_dataset(30, seed=2, config=WordProblemsConfig(worked_example="one_step"))
    for before, row in zip(default, one_step, strict=True):
        assert {**row, "prompt": None} == {**before, "prompt": None}
        assert row["prompt"][1:3] == [{"role": "user", "content": problem},
                                      {"role": "assistant", "content": answer}]  # fmt: skip
        assert row["prompt"][0] == before["prompt"][0] and row["prompt"][3] == before["prompt"][3]


@pytest.mark.parametrize("wrong", ["short", 1, 0.5])
def test_an_unknown_worked_example_is_refused_by_name(wrong):
    """worked_example takes true, false or story: anything else is refused, naming the field."""
    with pytest.raises(ValueError, match="worked_example: got .*allowed: true, false, story"):
        WordProblemsConfig(worked_example=wrong)


def test_every_spelling_of_worked_example_gives_the_same_prompt_and_config():
    """messages() reads worked_example as the task option does (true is "story"; false and
    None are no example), and a config rebuilt from its own fields (dataclasses.replace runs
    the check again on the stored value) keeps its example."""
    text = "Ann has 2 pens. Ann buys 4 more pens. How many pens does Ann have now?"
    assert messages(text, True) == messages(text, "story")
    assert messages(text, False) == messages(text, None) == messages(text, "story")[:1] + [
        {"role": "user", "content": text}]  # fmt: skip
    for value, stored in [(False, None), (True, "story"), ("one_step", "one_step")]:
        config = WordProblemsConfig(worked_example=value)
        assert config.worked_example == stored
        assert dataclasses.replace(config, max_value=90).worked_example == stored
