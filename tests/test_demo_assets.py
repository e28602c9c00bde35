"""Tests for the shipped demo checkpoint grpo/assets/arith-tiny (built by scripts/build_demo_model.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from grpo.tasks.arithmetic import (  # noqa: E402
    ArithmeticConfig,
    evaluate,
    generate_dataset,
    greedy_completions,
)

ASSET = Path(__file__).resolve().parents[1] / "grpo" / "assets" / "arith-tiny"
# The documented warm-start range (docs/demo.md): the model knows the format, not the sums.
WARM_START_RANGE = (0.15, 0.45)


@pytest.fixture(scope="module")
def demo():
    """The checkpoint loaded with the plain Auto classes, as a user would."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = transformers.AutoModelForCausalLM.from_pretrained(ASSET)
    tokenizer = transformers.AutoTokenizer.from_pretrained(ASSET)
    return model, tokenizer


@pytest.fixture(scope="module")
def info():
    """The build record written next to the weights."""
    return json.loads((ASSET / "build_info.json").read_text())


def test_checkpoint_is_small_and_in_safetensors():
    """The shipped folder holds safetensors weights and weighs at most 10 MB."""
    files = [f for f in ASSET.iterdir() if f.is_file()]
    assert (ASSET / "model.safetensors").is_file()
    assert not any(f.suffix == ".bin" for f in files)
    assert sum(f.stat().st_size for f in files) <= 10 * 1024 * 1024


def test_tokenizer_is_character_level_with_bos_and_clean_decoding(demo):
    """'12+7=' encodes as <bos> and one token per character; decoding adds no spaces."""
    _, tokenizer = demo
    ids = tokenizer("12+7=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == list("12+7=")
    answer = tokenizer("19", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(answer, skip_special_tokens=True) == "19"
    assert tokenizer.pad_token_id is not None and tokenizer.padding_side == "left"


def test_model_matches_its_build_record(demo, info):
    """The loaded model has the parameter count and vocabulary recorded at build time."""
    model, tokenizer = demo
    assert model.num_parameters() == info["model"]["parameters"]
    assert model.config.vocab_size == len(tokenizer)
    assert 300_000 <= model.num_parameters() <= 2_000_000


def test_greedy_held_out_accuracy_is_a_weak_warm_start(demo, info):
    """Greedy accuracy on 500 held-out problems is in the documented range and as recorded."""
    model, tokenizer = demo
    config = ArithmeticConfig(**{**info["task"], "operators": tuple(info["task"]["operators"])})
    held_out = generate_dataset(500, split="held_out", seed=0, config=config)
    result = evaluate(lambda prompts: greedy_completions(model, tokenizer, prompts), held_out)
    low, high = WARM_START_RANGE
    assert low <= result["accuracy"] <= high
    assert result["accuracy"] == pytest.approx(info["held_out_accuracy"], abs=0.01)


def test_model_has_learned_the_format(demo):
    """Greedy answers are digits only, end with <eos>, and have the right length on most problems."""
    model, tokenizer = demo
    rows = generate_dataset(200, split="held_out", seed=1)
    completions = greedy_completions(model, tokenizer, [r["prompt"] for r in rows])
    assert all(c.isdigit() for c in completions)
    same_length = sum(len(c) == len(r["answer"]) for c, r in zip(completions, rows, strict=True))
    assert same_length / len(rows) >= 0.9
