"""Packed completions (grpo.lm.packing through grpo.lm.scoring): the plain forward's log-probs
and gradients with the completions of a micro-batch run end to end in one row, and the padded
shared forward wherever packing does not apply."""

import logging

import pytest
import torch
from scoring_rows import (
    assert_same_scores,
    grouped_completions,
    input_shapes,
    score_and_grads,
    scoring_settings,
)
from tiny_models import ARCHS, gemma3_config, load_tiny_causal_lm
from transformers import AutoModelForCausalLM

import grpo.lm.scoring as scoring
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.packing import PACKING_CHECKS, packing_blocker


def _actions(vocab, eos):
    """Groups of 4 rows, completions of 0 to 9 tokens (one empty, one with tokens after its
    EOS): `scoring_rows.grouped_completions`."""
    return grouped_completions(vocab, eos, 4, lambda p, j: (3 * p + 5 * j) % 10)


def _settings(pack, share=True, **rest):
    return scoring_settings(share, pack=pack, **rest)


def _packed_length(actions):
    """L: every completion token that scores a later one, over all rows."""
    return sum(max(a.num_tokens - 1, 0) for a in actions)


def _assert_packed(model, actions, shapes):
    """The packed row ran, its first micro-batch agreed with the plain forward (no fallback:
    PACKING_CHECKS holds None), and no padded (n, T - 1) block of completions ran."""
    T = max(a.num_tokens for a in actions)
    assert (1, _packed_length(actions)) in shapes and PACKING_CHECKS.get(model, "unchecked") is None
    assert (len(actions), T - 1) not in shapes


def _compare(model, actions, eos, folded=False):
    """The packed scores and gradients against the plain forward's; the shapes fed."""
    PACKING_CHECKS.clear()
    expected = score_and_grads(model, actions, _settings(False, share=False, folded=folded, eos=eos))
    shapes = input_shapes(model)
    assert_same_scores(score_and_grads(model, actions, _settings(True, folded=folded, eos=eos)),
                       expected)  # fmt: skip
    return shapes


@pytest.mark.parametrize("folded", [False, True], ids=["logits", "chunked_output_layer"])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_scoring_equals_the_plain_forward(tiny_lm_dir, arch, folded):
    """Log-probs, entropy, mask and every weight gradient equal the plain forward's (1e-5) with
    ragged completions (empty, one token, tokens after EOS) and shuffled groups; the prompts
    ran once and the completions as one row of L tokens, no padded (n, T - 1) block."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
    eos = tokenizer.eos_token_id
    actions = _actions(len(tokenizer), eos)
    shapes = _compare(model, actions, eos, folded)
    prompts = {a.prompt_ids for a in actions}
    T = max(a.num_tokens for a in actions)
    assert shapes.count((len(prompts), max(len(p) for p in prompts))) == 1
    assert (1, _packed_length(actions)) in shapes
    assert (len(actions), T - 1) not in shapes


def test_eager_attention_takes_the_additive_mask(tiny_lm_dir):
    """With eager attention (a float mask added to the scores) packing scores the same."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    model.set_attn_implementation("eager")
    actions = _actions(len(tokenizer), tokenizer.eos_token_id)
    shapes = _compare(model, actions, tokenizer.eos_token_id)
    _assert_packed(model, actions, shapes)


def _gemma_with_window(window):
    config = gemma3_config(
        vocab_size=40, num_hidden_layers=3, sliding_window=window,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("folded", [False, True], ids=["logits", "chunked_output_layer"])
@pytest.mark.parametrize("window", [4, 64])
def test_a_sliding_window_packs_only_rows_inside_it(window, folded, monkeypatch, caplog):
    """Gemma 3 (sliding-window layers and a global one) with a window of 64, every row inside
    it, packs; with a window of 4, shorter than the prompts, the padded shared forward runs,
    logged once: the plain forward's scores and gradients either way."""
    monkeypatch.setattr("grpo.lm.packing._LOGGED", set())
    model = _gemma_with_window(window)
    actions = _actions(40, eos=1)
    with caplog.at_level(logging.INFO, logger="grpo.lm.packing"):
        shapes = _compare(model, actions, eos=1, folded=folded)
    packed = (1, _packed_length(actions)) in shapes
    assert packed == (window == 64)
    if packed:
        _assert_packed(model, actions, shapes)
    messages = [r.getMessage() for r in caplog.records]
    if window == 4:
        P = max(len(a.prompt_ids) for a in actions)
        T = max(a.num_tokens for a in actions)
        assert messages == [f"pack_completions: the padded rows score instead: rows of {P + T} "
                            "tokens pass the sliding window of 4"]  # fmt: skip


def test_lora_packs_the_same():
    """With non-zero LoRA adapters on Gemma 3 the packed log-probs and adapter gradients are
    the plain forward's."""
    model = apply_lora(_gemma_with_window(64), LoraSettings(r=4, alpha=8))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    actions = _actions(40, eos=1)
    shapes = _compare(model, actions, eos=1)
    _assert_packed(model, actions, shapes)


def test_other_attention_is_refused_by_name(tiny_lm_dir, monkeypatch):
    """An attention implementation the mask is not written for blocks packing, by name."""
    monkeypatch.setattr("grpo.lm.packing._LOGGED", set())
    model, _ = load_tiny_causal_lm(tiny_lm_dir("llama"))
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    assert packing_blocker(model, 10) == (
        "attention 'flash_attention_2' is not one whose 4D mask it writes (sdpa, eager)"
    )


def test_a_failed_first_check_falls_back_to_the_padded_rows(tiny_lm_dir, monkeypatch):
    """A packed forward that disagrees with the plain one on its first micro-batch is caught:
    that micro-batch and every later one score with the padded shared forward."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    eos = tokenizer.eos_token_id
    actions = _actions(len(tokenizer), eos)
    PACKING_CHECKS.clear()
    expected = score_and_grads(model, actions, _settings(False, share=False, eos=eos))
    forward = scoring.packed_prompt_forward
    monkeypatch.setattr(scoring, "packed_prompt_forward", lambda *args: forward(*args) + 0.1)
    for _ in range(2):
        assert_same_scores(score_and_grads(model, actions, _settings(True, eos=eos)), expected)
    assert "differs from the plain forward" in PACKING_CHECKS[model]
