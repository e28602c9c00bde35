"""Tests for grpo.lm_training: the text GRPO loop on tiny causal LMs."""

from __future__ import annotations

import math
import random

import pytest
import torch
from tiny_models import load_tiny_causal_lm, random_words, supervised_warm_start
from transformers import AutoModelForCausalLM

from grpo.config import GRPOConfig
from grpo.lm.loading import LoraSettings
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.lm_training import EvalConfig, ScheduleConfig, TextGRPOConfig, TextGRPOTrainer

CHOICES = ("yes", "no", "red", "blue", "green", "a", "b", "c")  # what the warm start teaches


def say_prompt(rng: random.Random) -> str:
    return "say " + random_words(rng, 1, 3, tuple("defghijk"))


def yes_fraction(prompts, completions, **_):
    """Share of the completion's words that are "yes" (0 for an empty completion)."""
    return [sum(w == "yes" for w in c.split()) / max(len(c.split()), 1) for c in completions]


def small_config(num_steps=4, **changes) -> TextGRPOConfig:
    grpo = changes.pop(
        "grpo",
        GRPOConfig(
            group_size=2,
            batch_size=4,
            num_epochs_per_update=1,
            kl_coeff=0.0,
            ref_update_frequency=0,
        ),
    )
    return TextGRPOConfig(
        prompts_per_step=2,
        grpo=grpo,
        policy=CausalLMSettings(GenerationSettings(max_new_tokens=3)),
        schedule=changes.pop("schedule", ScheduleConfig(num_steps=num_steps, learning_rate=1e-3)),
        evaluation=changes.pop("evaluation", EvalConfig(modes=("greedy",))),
        **changes,
    )


PROMPTS = [{"prompt": f"say {w}"} for w in "abcd"]


def test_grpo_raises_held_out_reward_from_a_warm_start(tiny_lm_dir):
    """Twelve GRPO steps on "share of yes" lift held-out greedy and sampled reward by a wide margin."""
    torch.manual_seed(0)
    rng = random.Random(0)
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    pairs = [(say_prompt(rng), random_words(rng, 2, 6, CHOICES)) for _ in range(400)]
    supervised_warm_start(model, tokenizer, pairs, steps=60)  # now emits CHOICES words, ~1/8 "yes"
    policy = CausalLMPolicy(
        model, tokenizer, CausalLMSettings(GenerationSettings(max_new_tokens=8))
    )
    config = TextGRPOConfig(
        prompts_per_step=8,
        grpo=GRPOConfig(
            group_size=8,
            batch_size=32,
            num_epochs_per_update=2,
            kl_coeff=0.02,
            ref_update_frequency=0,
            entropy_coeff=0.0,
        ),
        schedule=ScheduleConfig(num_steps=12, learning_rate=3e-3),
        evaluation=EvalConfig(samples_per_prompt=2),
    )
    train = [{"prompt": say_prompt(rng)} for _ in range(64)]
    held_out = [{"prompt": say_prompt(rng)} for _ in range(32)]
    trainer = TextGRPOTrainer(config, yes_fraction, train, held_out, policy=policy)
    history = trainer.train()
    before, after = trainer.evaluations[0], trainer.evaluations[-1]
    assert before["eval/sampled/reward_mean"] < 0.25
    assert after["eval/sampled/reward_mean"] > before["eval/sampled/reward_mean"] + 0.4
    assert after["eval/greedy/reward_mean"] > before["eval/greedy/reward_mean"] + 0.4
    last = history[-1]
    assert last["reward/change"] == pytest.approx(last["reward/mean"] - history[0]["reward/mean"])
    assert 0.0 <= last["loss/kl_share"] <= 1.0 and last["kl/mean"] > 0
    assert last["rewards/yes_fraction/mean"] == pytest.approx(last["reward/mean"], abs=1e-6)


@pytest.mark.parametrize(
    ("name", "factor"),
    [
        ("constant", lambda s: min(1.0, s / 2)),
        ("linear", lambda s: s / 2 if s < 2 else (6 - s) / 4),
        ("cosine", lambda s: s / 2 if s < 2 else 0.5 * (1 + math.cos(math.pi * (s - 2) / 4))),
    ],
)
def test_learning_rate_follows_the_schedule(tiny_lm_dir, name, factor):
    """Step s runs at lr * factor(s): linear warm-up over 2 steps, then constant, linear or cosine."""
    schedule = ScheduleConfig(num_steps=6, learning_rate=1e-3, lr_scheduler=name, warmup_steps=2)
    config = small_config(schedule=schedule, evaluation=EvalConfig(modes=()))
    trainer = TextGRPOTrainer(config, yes_fraction, PROMPTS, **model_policy(tiny_lm_dir, config))
    lrs = [record["lr"] for record in trainer.train()]
    assert lrs == pytest.approx([1e-3 * factor(s) for s in range(6)], rel=1e-6, abs=1e-12)


def model_policy(tiny_lm_dir, config, arch="qwen2"):
    """Keyword arguments giving TextGRPOTrainer a freshly loaded tiny policy."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
    return {"policy": CausalLMPolicy(model, tokenizer, config.policy)}


def test_evaluation_schedule_sink_and_accumulation(tiny_lm_dir):
    """Evaluations at steps 0, 2, 4 and 5; the sink sees every record; μ=2 x 2 windows = 4 updates."""
    grpo = GRPOConfig(
        group_size=2,
        batch_size=2,
        num_epochs_per_update=2,
        gradient_accumulation_steps=1,
        kl_coeff=0.0,
        ref_update_frequency=0,
        entropy_coeff=0.0,
    )
    config = small_config(num_steps=5, grpo=grpo, evaluation=EvalConfig(every=2, modes=("greedy",)))
    sink: list = []
    trainer = TextGRPOTrainer(
        config,
        yes_fraction,
        PROMPTS,
        PROMPTS[:2],
        sink=sink,
        **model_policy(tiny_lm_dir, config, "gpt2"),
    )
    history = trainer.train()
    assert [e["step"] for e in trainer.evaluations] == [0, 2, 4, 5]
    evals = [r for r in sink if "eval/samples" in r]
    assert [r["step"] for r in evals] == [0, 2, 4, 5] and len(sink) == 5 + 4
    assert all(h["optimizer_steps"] == 4 for h in history)  # N=4 samples / 2 per batch x 2 epochs
    assert {
        "completion/length_mean",
        "completion/truncated_frac",
        "reward/zero_std_frac",
        "clip/high_frac",
        "entropy/rollout_mean",
        "reward/positive_frac",
    } <= set(history[-1])


def test_saved_model_loads_with_plain_transformers(tiny_lm_dir, tmp_path):
    """Full fine-tuning saves safetensors that AutoModelForCausalLM loads to the same logits."""
    config = small_config(
        num_steps=1, output_dir=str(tmp_path / "out"), evaluation=EvalConfig(modes=())
    )
    trainer = TextGRPOTrainer(config, yes_fraction, PROMPTS, **model_policy(tiny_lm_dir, config))
    trainer.train()
    assert (tmp_path / "out" / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, trainer.policy.model.eval()(ids).logits)


def test_lora_saves_adapter_and_merged_weights(tiny_lm_dir, tmp_path):
    """LoRA run from a model path: adapter file written; merged/ loads in plain transformers, same logits."""
    config = small_config(
        num_steps=2,
        lora=LoraSettings(r=4, alpha=8),
        model_path=str(tiny_lm_dir("llama")),
        dtype="float32",
        output_dir=str(tmp_path / "lora"),
        save_merged=True,
        evaluation=EvalConfig(modes=()),
        schedule=ScheduleConfig(num_steps=2, learning_rate=0.05),
    )
    trainer = TextGRPOTrainer(config, yes_fraction, PROMPTS)
    trainer.train()
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "merged")
    base = AutoModelForCausalLM.from_pretrained(tiny_lm_dir("llama"))
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        lora_logits = trainer.policy.model.eval()(input_ids=ids).logits
        torch.testing.assert_close(merged(ids).logits, lora_logits, rtol=1e-5, atol=1e-5)
        assert (base(ids).logits - lora_logits).abs().max() > 1e-4  # the adapters did learn


def test_bad_input_is_reported(tiny_lm_dir, tmp_path):
    """Missing model folder, empty dataset, over-long prompt row and bad config values are clear errors."""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextGRPOTrainer(small_config(model_path=str(tmp_path / "nope")), yes_fraction, PROMPTS)
    config = small_config()
    with pytest.raises(ValueError, match="train_prompts is empty"):
        TextGRPOTrainer(config, yes_fraction, [], **model_policy(tiny_lm_dir, config))
    long_rows = [{"prompt": "say a"}, {"prompt": " ".join(["a"] * 70)}]
    with pytest.raises(ValueError, match="train_prompts row 1: state 0: prompt of 70 tokens"):
        TextGRPOTrainer(config, yes_fraction, long_rows, **model_policy(tiny_lm_dir, config))
    with pytest.raises(ValueError, match="schedule.lr_scheduler: got 'step'"):
        ScheduleConfig(lr_scheduler="step")
    with pytest.raises(ValueError, match="config.prompts_per_step: got 0"):
        TextGRPOConfig(prompts_per_step=0)
