"""Tests for grpo.lm.engines.vllm: request mapping on CPU; the engine itself on a CUDA GPU with vLLM.

The GPU tests build a tiny random-init Qwen2 (vocabulary a multiple of 64,
head size 64, bfloat16) and run the real engine; elsewhere they are skipped
with the reason.
"""

import gc
import importlib.util
import math
import os
import tempfile
from types import SimpleNamespace

import pytest
import torch
from tiny_models import build_tokenizer, load_tiny_causal_lm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2Config

from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings, VLLMSettings
from grpo.lm.engines.vllm import (
    VLLMEngine,
    parse_outputs,
    request_seeds,
    sampling_params_kwargs,
)
from grpo.lm.engines.vllm_build import write_model_folder
from grpo.lm.engines.vllm_requests import check_room
from grpo.lm.engines.vllm_sharing import match_names
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.rewards.combine import TextReward
from grpo.step.collect import ExperienceCollector
from grpo.step.trainer import GRPOTrainer

HAS_VLLM_GPU = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_VLLM_GPU, reason="needs vLLM and a CUDA GPU")


# ------------------------------------------------------------------ CPU
def test_sampling_params_mean_what_generation_settings_mean():
    """Temperature, top-p, top-k, stop strings, max tokens and every EOS map one to one."""
    settings = GenerationSettings(
        max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=5, stop_strings=("\n\n",)
    )
    kwargs = sampling_params_kwargs(settings, [2, 9], seed=11)
    assert {k: kwargs[k] for k in ("temperature", "top_p", "top_k", "max_tokens", "seed")} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 7,
        "seed": 11,
    }
    assert kwargs["stop"] == ["\n\n"] and kwargs["stop_token_ids"] == [2, 9]
    assert kwargs["logprobs"] == 0 and kwargs["n"] == 1 and kwargs["detokenize"] is True
    assert kwargs["repetition_penalty"] == 1.0 and kwargs["min_p"] == 0.0
    assert kwargs["ignore_eos"] is False and kwargs["skip_special_tokens"] is False


def test_greedy_settings_become_temperature_zero():
    """do_sample=False is vLLM's greedy decoding: temperature 0, no top-k/top-p, no detokenising."""
    settings = GenerationSettings(temperature=0.7, top_p=0.5, top_k=3, do_sample=False)
    kwargs = sampling_params_kwargs(settings, [2], seed=None)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"]) == (0.0, 1.0, 0)
    assert kwargs["detokenize"] is False and kwargs["seed"] is None


def test_request_seeds_are_distinct_and_reproducible():
    """Rows of one call, and of consecutive calls (seed, seed + 1), never share a seed."""
    first, second = request_seeds(4, 64), request_seeds(5, 64)
    assert len(set(first + second)) == 128
    assert request_seeds(4, 64) == first
    assert request_seeds(None, 3) == [None, None, None]


def test_check_room_refuses_a_rollout_past_the_context_limit():
    """Prompt + max_new_tokens past the limit is refused by name (vLLM would stop the
    completion there without marking it cut short); at the limit, or without one, it runs."""
    rows = [[1, 2, 3], [1] * 10]
    check_room(rows, 6, 16, "rollout.vllm.max_model_len")
    check_room(rows, 600, None, "rollout.vllm.max_model_len")
    with pytest.raises(ValueError, match=r"10 tokens \+ max_new_tokens 7 exceeds rollout\.vllm\.max_model_len \(16\)"):
        check_room(rows, 7, 16, "rollout.vllm.max_model_len")


def _output(ids, logprobs):
    entries = (
        None
        if logprobs is None
        else [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs, strict=True)]
    )
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(ids), logprobs=entries)])


def test_parse_outputs_reads_the_sampled_tokens_log_probs():
    """Each row's ids and the log-prob vLLM gave each of them, in request order."""
    samples = parse_outputs([_output([5, 6], [-0.5, -1.25]), _output([7], [-2.0])])
    assert samples.token_ids == [[5, 6], [7]]
    assert samples.logprobs == [[-0.5, -1.25], [-2.0]]
    with pytest.raises(RuntimeError, match="row 0"):
        parse_outputs([_output([5, 6], None)])


def test_model_folder_holds_config_and_tokenizer(tiny_lm_dir, tmp_path):
    """vLLM's folder: the config naming the architecture, and the tokenizer; for LoRA, the base's."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    lora = apply_lora(model, LoraSettings(r=2))
    write_model_folder(lora, tokenizer, str(tmp_path))
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert config.hidden_size == model.config.hidden_size
    assert (
        AutoTokenizer.from_pretrained(tmp_path)("say a")["input_ids"]
        == tokenizer("say a")["input_ids"]
    )


def test_unmatched_names_say_how_to_copy_unchecked():
    """A name vLLM has and the trainer lacks fails with the way out; unchecked copies need no names."""
    engine = {"model.layers.0.mlp.fused_w13.weight": torch.zeros(2)}
    trainer = {"model.layers.0.mlp.up_proj.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="fused_w13.weight has no trainer counterpart") as info:
        match_names(engine, trainer, VLLMSettings())
    assert "vllm.weight_sync: load_weights and vllm.check_weights: false" in str(info.value)
    unchecked = VLLMSettings(weight_sync="load_weights", check_weights=False)
    assert match_names(engine, trainer, unchecked) == {}


def _closable_engine(asleep: bool):
    """A VLLMEngine around a stand-in LLM that records what close() does to it."""
    calls = []
    core = SimpleNamespace(shutdown=lambda: calls.append("shutdown"))
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(engine_core=core), wake_up=lambda: calls.append("wake_up")
    )
    engine = object.__new__(VLLMEngine)
    engine.llm, engine._awake = llm, not asleep
    engine._folder = tempfile.TemporaryDirectory(prefix="grpo-vllm-test-")
    return engine, calls


def test_close_shuts_vllm_down_once_and_then_refuses_work():
    """close(): wake (vLLM frees its pool mapped), shut the engine core down, remove the
    folder; a second close does nothing; any later use of vLLM raises."""
    engine, calls = _closable_engine(asleep=True)
    folder = engine._folder.name
    engine.close()
    assert calls == ["wake_up", "shutdown"] and engine.llm is None
    assert not os.path.exists(folder)
    engine.close()
    assert calls == ["wake_up", "shutdown"]
    with pytest.raises(RuntimeError, match="engine is closed"):
        engine._call(lambda m: m)


def test_engine_closes_when_its_with_block_fails():
    """Used as a context manager, the engine is closed on the way out of an error."""
    engine, calls = _closable_engine(asleep=False)
    with pytest.raises(ValueError), engine:
        raise ValueError("a failing step")
    assert calls == ["shutdown"] and engine.llm is None


# ------------------------------------------------------------------ GPU
def _gpu_model(tmp_path, dtype=torch.bfloat16):
    """A tiny random Qwen2 on the GPU whose layout vLLM can share (vocab % 64 == 0, head size 64)."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.1,  # peaked distributions: wrong weights show as a large gap
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).to("cuda")
    return model, tokenizer


def _vllm_policy(model, tokenizer, **vllm):
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=16, temperature=1.0, seed=0))
    rollout = RolloutSettings(
        engine="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.15, max_model_len=256, **vllm)
    )
    return CausalLMPolicy(model, tokenizer, settings, rollout)


PROMPTS = [{"prompt": "say a b"}, {"prompt": "count c d e"}, {"prompt": "write red"}]


def _reward():
    return TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])


def _release(policy):
    policy.close()
    del policy
    gc.collect()
    torch.cuda.empty_cache()


def _gap(policy, groups):
    """Mean |trainer - engine| log-prob over counted tokens of already sampled groups."""
    actions = [a for g in groups for a in g]
    states = [s for s, g in zip(PROMPTS, groups, strict=True) for _ in g]
    with torch.no_grad():
        policy.get_token_log_probabilities(states, actions)
    return policy.rollout_metrics["rollout/logprob_gap_mean"]


@needs_gpu
def test_shared_engine_tracks_the_trainer_through_updates(tmp_path):
    """Zero-copy: no sleep mode (its pool would keep vLLM's dummy weights), same storage after
    steps, vLLM's log-probs follow each update."""
    model, tokenizer = _gpu_model(tmp_path)
    policy = _vllm_policy(model, tokenizer)
    engine = policy.rollout_engine
    assert engine.shared, engine.sharing_problems
    assert not engine.sleeps and engine._awake
    groups = policy.generate_actions(PROMPTS, 4)
    for a in (a for g in groups for a in g):
        assert len(a.engine_logprobs) == a.num_tokens <= 16
        assert a.finished_by_eos == (a.completion_ids[-1] in policy.eos_token_ids)
    fresh_gap = _gap(policy, groups)
    config = GRPOConfig(group_size=4, batch_size=12, kl_coeff=0.0, learning_rate=1e-2)
    metrics = GRPOTrainer(policy, _reward(), None, config).train_step(PROMPTS)
    assert math.isfinite(metrics["loss/policy"])
    stale_gap = _gap(policy, groups)  # old samples, updated trainer
    engine.check()  # raises unless vLLM computes with the trainer's tensors
    new_groups = policy.generate_actions(PROMPTS, 4)
    new_gap = _gap(policy, new_groups)
    assert math.isfinite(policy.rollout_metrics["rollout/logprob_gap_max"])
    assert fresh_gap < 0.05 and new_gap < 0.05
    assert stale_gap > 5 * max(fresh_gap, new_gap)  # vLLM really sampled with the update
    _release(policy)


@needs_gpu
def test_copy_fallback_for_another_dtype_is_checked(tmp_path):
    """A float32 trainer with a bfloat16 vLLM copies before each rollout; a stale copy fails the check."""
    model, tokenizer = _gpu_model(tmp_path, dtype=torch.float32)
    policy = _vllm_policy(model, tokenizer, dtype="bfloat16", tis_cap=2.0)
    engine = policy.rollout_engine
    assert not engine.shared and "dtype" in engine.sharing_problems[0]
    config = GRPOConfig(group_size=4, batch_size=12, kl_coeff=0.0, learning_rate=1e-3)
    metrics = GRPOTrainer(policy, _reward(), None, config).train_step(PROMPTS)
    assert math.isfinite(metrics["importance_weight/mean"])
    assert engine.sleeps and not engine._awake  # asleep (level 2): its copy is discarded
    engine._wake()
    with pytest.raises(RuntimeError, match="does not hold the trainer's weights"):
        engine.check()  # awake, before a sync: not the trainer's weights
    policy.generate_actions(PROMPTS, 2)  # copies, then checks
    engine.check()
    _release(policy)


@needs_gpu
def test_lora_model_is_synced_merged(tmp_path):
    """A LoRA policy gets W + BA copied into vLLM, checked after an adapter update."""
    model, tokenizer = _gpu_model(tmp_path)
    policy = _vllm_policy(apply_lora(model, LoraSettings(r=4)), tokenizer)
    assert not policy.rollout_engine.shared
    batch = ExperienceCollector(policy, _reward(), 2).collect_experiences(PROMPTS)
    assert batch.old_token_logprobs is not None
    config = GRPOConfig(group_size=2, batch_size=6, kl_coeff=0.0, learning_rate=1e-2)
    GRPOTrainer(policy, _reward(), None, config).train_step(PROMPTS)
    groups = policy.generate_actions(PROMPTS, 2)  # sync of the updated adapters, checked
    assert _gap(policy, groups) < 0.05
    _release(policy)
