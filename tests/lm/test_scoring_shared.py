"""Shared-prompt scoring (grpo.lm.prefix through grpo.lm.scoring): the same log-probs and
gradients as the plain forward, and the plain forward wherever sharing does not apply."""

import logging

import pytest
import torch
from scoring_rows import (
    TOLERANCE,
    assert_same_scores,
    grouped_completions,
    input_shapes,
    score_and_grads,
    scoring_settings,
)
from tiny_models import ARCHS, BASE_ARCHS, gemma3_config, load_tiny_causal_lm
from transformers import AutoModelForCausalLM, MistralConfig, Qwen3Config

import grpo.lm.scoring as scoring
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.prefix import cache_argument, group_prompts, shared_prompt_forward
from grpo.lm.sampling import GenerationSettings
from grpo.lm.scoring import score_completions


def _actions(vocab, eos):
    """Groups of 3 rows, completions of 0 to 5 tokens (one empty, one of 1 token, one with
    tokens after its EOS): `scoring_rows.grouped_completions`."""
    return grouped_completions(vocab, eos, 3, lambda p, j: (p + 2 * j) % 6)


_settings = scoring_settings


def _assert_shared(shapes, actions):
    """The distinct prompts ran alone, once, and no forward ran whole rows (prompt and
    completion): the scores are the shared forward's, not a fallback's."""
    prompts = {a.prompt_ids for a in actions}
    P, T = max(len(p) for p in prompts), max(a.num_tokens for a in actions)
    assert shapes.count((len(prompts), P)) == 1
    assert (len(actions), T - 1) in shapes  # every completion, its last token left out
    assert (len(actions), P + T) not in shapes


@pytest.mark.parametrize("folded", [False, True], ids=["logits", "chunked_output_layer"])
@pytest.mark.parametrize("arch", ARCHS + BASE_ARCHS)
def test_shared_scoring_equals_the_plain_forward(tiny_lm_dir, arch, folded):
    """Log-probs, entropy, mask and every weight gradient equal the plain forward's (1e-5), with
    ragged left-padded prompts and shuffled groups, and each distinct prompt runs once."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
    eos = tokenizer.eos_token_id
    actions = _actions(len(tokenizer), eos)
    expected = score_and_grads(model, actions, _settings(False, folded, eos=eos))
    shapes = input_shapes(model)
    got = score_and_grads(model, actions, _settings(True, folded, eos=eos))
    assert_same_scores(got, expected)
    _assert_shared(shapes, actions)


CONFIGS = {
    "mistral_window_4": lambda **shape: MistralConfig(sliding_window=4, **shape),
    "qwen3": lambda **shape: Qwen3Config(head_dim=8, **shape),
    # a window shorter than the prompts in every layer but the last (global) one
    "gemma3_window_4": lambda **shape: gemma3_config(
        **{**shape, "num_hidden_layers": 3, "head_dim": 8}, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sliding_window_and_qwen3_models_score_the_same(name):
    """Mistral and Gemma 3 with a window shorter than the prompts (Gemma 3's last layer
    global), and Qwen3 (per-head norms): the same log-probs and gradients as the plain
    forward."""
    config = CONFIGS[name](
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    actions = _actions(40, eos=1)
    expected = score_and_grads(model, actions, _settings(False))
    shapes = input_shapes(model)
    assert_same_scores(score_and_grads(model, actions, _settings(True)), expected)
    _assert_shared(shapes, actions)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_lora_policy_and_its_reference(tiny_lm_dir, arch):
    """With non-zero LoRA adapters, the policy's log-probs and adapter gradients and the
    adapters-disabled reference's log-probs equal the plain forward's."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
    model = apply_lora(model, LoraSettings(r=4, alpha=8))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    generation = GenerationSettings(max_new_tokens=6, temperature=0.7, seed=3)
    policies = {
        share: CausalLMPolicy(
            model, tokenizer, CausalLMSettings(generation, 64, share_prompt_prefix=share)
        )
        for share in (False, True)
    }
    actions = _actions(len(tokenizer), tokenizer.eos_token_id)
    settings = {share: policy.scoring_settings() for share, policy in policies.items()}
    expected = score_and_grads(model, actions, settings[False])
    shapes = input_shapes(model)
    assert_same_scores(score_and_grads(model, actions, settings[True]), expected)
    _assert_shared(shapes, actions)
    states = [None] * len(actions)
    with torch.no_grad():
        references = {s: p.make_reference() for s, p in policies.items()}
        want = references[False].get_token_log_probabilities(states, actions).logprobs
        shapes = input_shapes(model)
        got = references[True].get_token_log_probabilities(states, actions).logprobs
        _assert_shared(shapes, actions)
        policy_logprobs = policies[True].get_token_log_probabilities(states, actions).logprobs
    torch.testing.assert_close(got, want, **TOLERANCE)
    assert (policy_logprobs - got).abs().max() > 1e-3  # the reference is not the policy


def test_distinct_prompts_and_mixed_micro_batches(tiny_lm_dir):
    """Rows whose prompts all differ, run through the shared forward itself, equal the plain
    forward; micro-batches of 4 (some sharing prompts, some not) score as the plain forward."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("gpt2"))
    eos = tokenizer.eos_token_id
    actions = _actions(len(tokenizer), eos)
    mixed = _settings(True, micro_batch_size=4, eos=eos)
    assert_same_scores(
        score_and_grads(model, actions, mixed),
        score_and_grads(model, actions, _settings(False, eos=eos)),
    )
    distinct = list({a.prompt_ids: a for a in actions}.values())  # one row per prompt
    rows = scoring._rows(model, distinct, _settings(False, eos=eos), share=False)
    T = rows.completion_ids.shape[1]
    with torch.no_grad():
        want = model(**rows.inputs).logits[:, -T - 1 : -1]  # (n, T, V)
        prompts = group_prompts([a.prompt_ids for a in distinct], pad_id=0)
        got = shared_prompt_forward(
            model, prompts, rows.completion_ids, rows.present, lambda out: out.logits, {},
            cache_argument(model),
        )  # fmt: skip
    real = rows.present.bool()
    torch.testing.assert_close(got[real], want[real], **TOLERANCE)


def _count_shared(model, actions, settings, grad=True):
    """Scores, and how many forwards ran the distinct prompts alone (the shared prompt pass)."""
    shapes = input_shapes(model)
    with torch.set_grad_enabled(grad):
        out, _ = score_completions(model, actions, settings)
    prompts = {a.prompt_ids for a in actions}
    return out, shapes.count((len(prompts), max(len(p) for p in prompts)))


def test_gradient_checkpointing_falls_back_in_the_gradient_pass_only(
    tiny_lm_dir, caplog, monkeypatch
):
    """With gradient checkpointing (which drops the cache) the gradient pass runs the plain
    forward, says why once, and scores the same; a no-grad pass still shares."""
    monkeypatch.setattr("grpo.lm.prefix._LOGGED", set())
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    generation = GenerationSettings(max_new_tokens=6)
    settings = CausalLMSettings(generation, micro_batch_size=64, gradient_checkpointing=True)
    policy = CausalLMPolicy(model, tokenizer, settings)
    actions = _actions(len(tokenizer), tokenizer.eos_token_id)
    policy.train()
    with caplog.at_level(logging.INFO, logger="grpo.lm.prefix"):
        out, shared = _count_shared(model, actions, policy.scoring_settings())
        _count_shared(model, actions, policy.scoring_settings())
    assert shared == 0
    assert [r.getMessage() for r in caplog.records].count(
        "share_prompt_prefix: the plain forward scores instead: gradient checkpointing drops "
        "the KV cache in the gradient pass"
    ) == 1
    plain, _ = _count_shared(
        model, actions, policy.scoring_settings()._replace(share_prompt_prefix=False)
    )
    torch.testing.assert_close(out.logprobs, plain.logprobs, **TOLERANCE)
    no_grad, shared = _count_shared(model, actions, policy.scoring_settings(), grad=False)
    assert shared > 0
    torch.testing.assert_close(no_grad.logprobs, plain.logprobs, **TOLERANCE)


def _fallback_case(tiny_lm_dir, arch):
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
    actions = _actions(len(tokenizer), tokenizer.eos_token_id)
    plain, _ = _count_shared(model, actions, _settings(False, eos=tokenizer.eos_token_id))
    return model, actions, plain, _settings(True, eos=tokenizer.eos_token_id)


def test_a_model_type_off_the_list_falls_back(tiny_lm_dir, monkeypatch, caplog):
    """A model type not in SHARED_PREFIX_MODEL_TYPES scores with the plain forward, logged once."""
    monkeypatch.setattr("grpo.lm.prefix._LOGGED", set())
    monkeypatch.setattr("grpo.lm.prefix.SHARED_PREFIX_MODEL_TYPES", ("gpt2",))
    model, actions, plain, settings = _fallback_case(tiny_lm_dir, "llama")
    with caplog.at_level(logging.INFO, logger="grpo.lm.prefix"):
        for _ in range(2):
            got, shared = _count_shared(model, actions, settings)
            assert shared == 0
            torch.testing.assert_close(got.logprobs, plain.logprobs, **TOLERANCE)
    assert [r.getMessage() for r in caplog.records] == [
        "share_prompt_prefix: the plain forward scores instead: model type 'llama' is not one "
        "it was checked on (gpt2)"
    ]


def test_a_failed_first_check_turns_sharing_off(tiny_lm_dir, monkeypatch, caplog):
    """A shared forward that disagrees with the plain one on its first micro-batch is caught:
    that micro-batch and every later one get the plain forward's scores, logged."""
    monkeypatch.setattr("grpo.lm.prefix._LOGGED", set())
    model, actions, plain, settings = _fallback_case(tiny_lm_dir, "gpt2")
    forward = scoring.shared_prompt_forward
    monkeypatch.setattr(scoring, "shared_prompt_forward", lambda *args: forward(*args) + 0.1)
    with caplog.at_level(logging.INFO, logger="grpo.lm.prefix"):
        got, shared = _count_shared(model, actions, settings)
        again, shared_again = _count_shared(model, actions, settings)
    assert (shared, shared_again) == (1, 0)
    torch.testing.assert_close(got.logprobs, plain.logprobs, **TOLERANCE)
    torch.testing.assert_close(again.logprobs, plain.logprobs, **TOLERANCE)
    (record,) = caplog.records
    assert "on GPT2LMHeadModel it differs from the plain forward by" in record.getMessage()
