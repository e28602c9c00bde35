"""Tests for grpo.run.data: loading and validating prompt datasets, drawing prompt batches."""

from __future__ import annotations

import json

import datasets
import pytest
from tiny_models import load_tiny_causal_lm

from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.run.data import check_prompt_lengths, load_prompts

ROWS = [
    {"prompt": "say a", "answer": "a"},
    {"prompt": [{"role": "user", "content": "say b"}], "answer": "b"},
]


def test_list_jsonl_and_dataset_give_the_same_records(tmp_path):
    """A list of dicts, a JSONL file (blank lines skipped) and a datasets.Dataset load identically."""
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n", encoding="utf-8")
    assert load_prompts(ROWS) == load_prompts(path) == load_prompts(str(path)) == ROWS
    chats = [{"prompt": [{"role": "user", "content": f"say {w}"}], "answer": w} for w in "ab"]
    assert load_prompts(datasets.Dataset.from_list(chats)) == chats  # one type per arrow column


def test_bare_prompts_and_a_custom_prompt_key():
    """Bare strings/message lists become {"prompt": ...}; prompt_key renames a column to "prompt"."""
    messages = [{"role": "user", "content": "hi"}]
    assert load_prompts(["say a", messages]) == [{"prompt": "say a"}, {"prompt": messages}]
    assert load_prompts([{"question": "q", "answer": 1}], prompt_key="question") == [
        {"prompt": "q", "answer": 1}
    ]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "train is empty"),
        ([{"prompt": "a"}, {"question": "b"}], "train row 1: no 'prompt' key"),
        ([{"prompt": "a"}, {"prompt": "  "}], "train row 1: the prompt is empty"),
        ([{"prompt": [{"role": "user"}]}], "train row 0: message 0"),
        ([{"prompt": 3}], "train row 0: the prompt is int"),
        ([{"prompt": "a"}, 7], "train row 1: got int"),
    ],
)
def test_bad_rows_are_named(rows, message):
    """Every invalid row is reported with the dataset name and its index."""
    with pytest.raises((ValueError, TypeError), match=message):
        load_prompts(rows, name="train")


def test_bad_files_are_named(tmp_path):
    """A missing file, invalid JSON (with its line number) and an empty file are clear errors."""
    with pytest.raises(FileNotFoundError, match="no such JSONL file"):
        load_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(ValueError, match="dataset line 2 of .* is not valid JSON"):
        load_prompts(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="dataset is empty"):
        load_prompts(empty)
    with pytest.raises(TypeError, match="got int"):
        load_prompts(3)


def test_records_remember_the_file_line_they_were_read_from(tmp_path):
    """A record's source names its real file line (blank lines counted); a bad row its line too."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n', encoding="utf-8")
    rows = load_prompts(path, name="train")
    assert [r.source for r in rows] == [f"train line {n} of {str(path)!r}" for n in (1, 3)]
    assert load_prompts(rows, name="again")[1].source == rows[1].source  # kept on reloading
    assert load_prompts(["x", "y"], name="list")[1].source == "list row 1"
    path.write_text('{"prompt": "a"}\n\n"bare prompt"\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="train line 4 of .*: got list \\[1, 2\\]; allowed: a JSON"):
        load_prompts(path, name="train")


def test_reward_columns_are_checked_for_rewards_and_accuracy():
    """check_reward_columns names the first row lacking a column a reward or accuracy requires."""
    from grpo.rewards.combine import TextReward
    from grpo.run.data import check_reward_columns

    def exact(prompts, completions, answer):
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    rows = load_prompts([{"prompt": "a", "answer": "a"}, {"prompt": "b"}], name="held-out")
    check_reward_columns(rows[:1], TextReward(exact), accuracy=exact)
    with pytest.raises(ValueError, match="^held-out row 1: no column 'answer', which reward"):
        check_reward_columns(rows, TextReward(exact))
    with pytest.raises(ValueError, match="^held-out row 1: no column 'answer'.* 'exact'"):
        check_reward_columns(rows, object(), accuracy=exact)  # another reward model: not read


def test_prompt_longer_than_context_names_the_row(tiny_lm_dir):
    """check_prompt_lengths reports the first row whose prompt + max_new_tokens exceeds the context."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    policy = CausalLMPolicy(
        model, tokenizer, CausalLMSettings(GenerationSettings(max_new_tokens=8))
    )
    rows = load_prompts(["say a", "say b", " ".join(["a"] * 60)], name="train")
    with pytest.raises(ValueError, match="^train row 2: prompt of 60 tokens"):
        check_prompt_lengths(rows, policy, name="train")
    check_prompt_lengths(rows[:2], policy)
