"""Tests for grpo.run.text: `TextTrainer`, the Python entry point for text models."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest
import torch
from tiny_models import load_tiny_causal_lm, random_words, supervised_warm_start
from transformers import AutoModelForCausalLM

from grpo import TextTrainer
from grpo.cli import main
from grpo.run.structured import ConfigError
from grpo.tasks import arithmetic

REPO = Path(__file__).resolve().parents[2]
CHOICES = ("yes", "no", "red", "blue", "green", "a", "b", "c")  # what the warm start teaches
PROMPTS = [{"prompt": f"say {w}"} for w in "abcd"]


def say_prompt(rng: random.Random) -> str:
    return "say " + random_words(rng, 1, 3, tuple("defghijk"))


def yes_fraction(prompts, completions, **_):
    """Share of the completion's words that are "yes" (0 for an empty completion)."""
    return [sum(w == "yes" for w in c.split()) / max(len(c.split()), 1) for c in completions]


def text_length(prompts, completions, **_):
    """Characters in the completion: differs between samples even for an untrained model."""
    return [float(len(c)) for c in completions]


def text_hash(prompts, completions, **_):
    """A number per distinct completion text: two different samples almost never tie."""
    return [float(zlib.crc32(c.encode()) % 97) for c in completions]


def small_config(run_dir: Path, num_steps: int = 4, **sections) -> dict:
    """A tiny run: B 2 x G 2, 3 new tokens, no KL, no TensorBoard."""
    config = {
        "prompts_per_step": 2,
        "grpo": {"group_size": 2, "batch_size": 4, "kl_coeff": 0.0},
        "model": {"use_reference": False},
        "policy": {"generation": {"max_new_tokens": 3}},
        "schedule": {"num_steps": num_steps, "learning_rate": 1e-3},
        "evaluation": {"modes": ["greedy"]},
        "run": {"dir": str(run_dir), "tensorboard": False, "checkpoint_every": 0},
    }
    for name, values in sections.items():
        config[name] = {**config[name], **values} if isinstance(values, dict) else values
    return config


def metrics_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_grpo_raises_held_out_reward_from_a_warm_start(tiny_lm_dir, tmp_path):
    """Twelve steps on "share of yes" lift held-out greedy and sampled reward by a wide margin."""
    torch.manual_seed(0)
    rng = random.Random(0)
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    pairs = [(say_prompt(rng), random_words(rng, 2, 6, CHOICES)) for _ in range(400)]
    supervised_warm_start(model, tokenizer, pairs, steps=60)  # now emits CHOICES words, ~1/8 "yes"
    config = small_config(
        tmp_path / "run", num_steps=12, prompts_per_step=8,
        grpo={"group_size": 8, "batch_size": 32, "num_epochs_per_update": 2, "kl_coeff": 0.02},
        model={"use_reference": True}, policy={"generation": {"max_new_tokens": 8}},
        schedule={"learning_rate": 3e-3}, evaluation={"modes": ["greedy", "sampled"],
                                                      "samples_per_prompt": 2},
    )  # fmt: skip
    train = [{"prompt": say_prompt(rng)} for _ in range(64)]
    held_out = [{"prompt": say_prompt(rng)} for _ in range(32)]
    trainer = TextTrainer(model, yes_fraction, train, held_out, config=config, tokenizer=tokenizer)
    summary = trainer.train()
    before, after = summary["before"], summary["after"]
    assert before["eval/sampled/reward_mean"] < 0.25
    assert after["eval/sampled/reward_mean"] > before["eval/sampled/reward_mean"] + 0.4
    assert after["eval/greedy/reward_mean"] > before["eval/greedy/reward_mean"] + 0.4
    steps = [row for row in metrics_rows(tmp_path / "run") if "reward/mean" in row]
    first, last = steps[0], steps[-1]
    assert len(steps) == 12
    assert last["reward/change"] == pytest.approx(last["reward/mean"] - first["reward/mean"])
    assert 0.0 <= last["loss/kl_share"] <= 1.0 and last["kl/mean"] > 0
    assert last["rewards/yes_fraction/mean"] == pytest.approx(last["reward/mean"], abs=1e-6)


def test_evaluation_cadence_and_accumulation(tiny_lm_dir, tmp_path):
    """Evaluations at steps 0, 2, 4 and 5; μ = 2 epochs x 2 mini-batches = 4 updates a step."""
    config = small_config(
        tmp_path / "run", num_steps=5, grpo={"batch_size": 2, "num_epochs_per_update": 2},
        evaluation={"every": 2},
    )  # fmt: skip
    trainer = TextTrainer(tiny_lm_dir("gpt2"), text_hash, PROMPTS, PROMPTS[:2], config=config)
    trainer.train()
    rows = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in rows if "eval/greedy/reward_mean" in r] == [0, 2, 4, 5]
    assert all(r["reward/zero_std_frac"] < 1 for r in rows if "reward/mean" in r)  # it learns
    history = [r for r in rows if "reward/mean" in r]
    assert len(history) == 5 and all(h["optimizer_steps"] == 4 for h in history)
    expected = {"completion/length_mean", "completion/truncated_frac", "reward/zero_std_frac",
                "clip/high_frac", "entropy/rollout_mean", "reward/positive_frac"}  # fmt: skip
    assert expected <= set(history[-1])


def test_saved_model_loads_with_plain_transformers(tiny_lm_dir, tmp_path):
    """Full fine-tuning saves safetensors that AutoModelForCausalLM loads to the same logits."""
    config = small_config(tmp_path / "run", num_steps=1)
    trainer = TextTrainer(tiny_lm_dir("qwen2"), yes_fraction, PROMPTS, config=config)
    trainer.train()
    final = tmp_path / "run" / "final"
    assert (final / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(final)
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        trained = trainer.parts.policy.model.eval()(ids).logits
        torch.testing.assert_close(loaded(ids).logits, trained)


def test_lora_saves_adapter_and_merged_weights(tiny_lm_dir, tmp_path):
    """LoRA from a model folder: the adapter is written; merged/ loads in plain transformers."""
    config = small_config(
        tmp_path / "run", num_steps=2, schedule={"learning_rate": 0.05},
        model={"lora": {"r": 4, "alpha": 8}, "save_merged": True, "dtype": "float32"},
    )  # fmt: skip
    trainer = TextTrainer(tiny_lm_dir("llama"), text_length, PROMPTS, config=config)
    trainer.train()
    final = tmp_path / "run" / "final"
    assert (final / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(final / "merged")
    base = AutoModelForCausalLM.from_pretrained(tiny_lm_dir("llama"))
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        lora_logits = trainer.parts.policy.model.eval()(input_ids=ids).logits
        torch.testing.assert_close(merged(ids).logits, lora_logits, rtol=1e-5, atol=1e-5)
        assert (base(ids).logits - lora_logits).abs().max() > 1e-4  # the adapters did learn


def test_bad_input_is_named_before_anything_is_written(tiny_lm_dir, tmp_path):
    """A missing model folder, an empty or malformed dataset and grpo.learning_rate are errors
    raised at construction, naming what is wrong; nothing is written."""
    config = small_config(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextTrainer(tmp_path / "nope", yes_fraction, PROMPTS, config=config)
    model = tiny_lm_dir("qwen2")
    with pytest.raises(ValueError, match="train_dataset is empty"):
        TextTrainer(model, yes_fraction, [], config=config)
    with pytest.raises(ValueError, match="eval_dataset row 1: no 'prompt' key"):
        TextTrainer(model, yes_fraction, PROMPTS, [{"prompt": "a"}, {"q": "b"}], config=config)
    with pytest.raises(ConfigError, match="grpo.learning_rate"):
        TextTrainer(model, yes_fraction, PROMPTS, config=config, overrides=["grpo.learning_rate=1"])
    with pytest.raises(ValueError, match="tokenizer: got None"):
        TextTrainer(load_tiny_causal_lm(model)[0], yes_fraction, PROMPTS, config=config)
    loaded, tokenizer = load_tiny_causal_lm(model)
    for override, named in (("model.lora.r=4", "model.lora"), ("model.dtype=bfloat16", "model.dtype"),
                            ("model.freeze=[lm_head.*]", "model.freeze")):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"{named}: got .* with a model object"):
            TextTrainer(loaded, yes_fraction, PROMPTS, config=config, overrides=[override],
                        tokenizer=tokenizer)  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_an_over_long_prompt_names_its_row(tiny_lm_dir, tmp_path):
    """A prompt that leaves no room to generate is reported with its row before any step."""
    long_rows = [{"prompt": "say a"}, {"prompt": " ".join(["a"] * 70)}]
    trainer = TextTrainer(tiny_lm_dir("qwen2"), yes_fraction, long_rows,
                          config=small_config(tmp_path / "run"))  # fmt: skip
    with pytest.raises(ValueError, match="^train_dataset row 1: prompt of 70 tokens"):
        trainer.train()
    assert not (tmp_path / "run").exists()  # no folder: the same call runs once it is fixed


def test_the_demo_through_python_equals_grpo_train_bit_for_bit(tmp_path, monkeypatch):
    """configs/demo.yaml (shortened) through TextTrainer and through `grpo train`: same weights."""
    monkeypatch.chdir(REPO)  # the demo names its model by a path relative to the repository
    shorter = ["schedule.num_steps=3", "task.train_size=96", "task.eval_size=8", "run.tensorboard=false"]
    sets = [arg for item in [*shorter, f"run.dir={tmp_path / 'cli'}"] for arg in ("--set", item)]
    assert main(["train", "configs/demo.yaml", *sets]) == 0

    options = arithmetic.ArithmeticConfig(num_operands=2, max_digits=2, operators=("+",))
    train = arithmetic.generate_dataset(96, split="train", seed=1000, config=options)
    held_out = arithmetic.generate_dataset(8, split="held_out", seed=0, config=options)
    trainer = TextTrainer("grpo/assets/arith-tiny", {"correct": arithmetic.reward}, train, held_out,
                          accuracy=arithmetic.reward, config="configs/demo.yaml",
                          overrides=[*shorter, f"run.dir={tmp_path / 'python'}"])  # fmt: skip
    trainer.train()
    weights = [(tmp_path / run / "final" / "model.safetensors").read_bytes() for run in ("cli", "python")]
    assert weights[0] == weights[1]
    rows = [metrics_rows(tmp_path / run) for run in ("cli", "python")]
    drop = ("time", "throughput/", "memory/")  # wall times ("time", "time/...") and memory
    assert [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows[0]] == [
        {k: v for k, v in r.items() if not k.startswith(drop)} for r in rows[1]
    ]
