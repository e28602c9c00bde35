"""Tests for the lean rollout engine (grpo.lm.engines.lean).

The references are independent: transformers' own logits warpers, `generate`
with greedy decoding, and a loop without any cache that runs the model's full
forward over the whole sequence before every token. "gemma3" is a Gemma 3 text
model built here (`tiny_gemma3`): sliding-window and full-attention layers with
their two rotary bases, query scaling from `query_pre_attn_scalar`, soft-capped logits.
"""

import copy
import dataclasses

import pytest
import torch
from tiny_models import build_tokenizer, gemma3_config, load_tiny_causal_lm
from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, MistralConfig

from grpo.config import GRPOConfig
from grpo.functional.sampling import choose_tokens
from grpo.lm.engines import RolloutSettings
from grpo.lm.engines.lean import LeanDecoder, LeanEngine
from grpo.lm.engines.lean_families import FAMILIES
from grpo.lm.engines.transformers import sample_token_ids
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings, left_pad, split_completion
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer

PROMPTS = ["say a b c", "count", "one two three four five", "b"]  # 4, 1, 19 and 1 tokens
SLIDING, FULL = "sliding_attention", "full_attention"


def tiny_gemma3(window=40, layer_types=(SLIDING, FULL, SLIDING, FULL), **config):
    """A random Gemma3ForCausalLM (hidden 32, head_dim 8, query_pre_attn_scalar 16, logits
    soft-capped at 3) and the tests' tokenizer. Its norms' weights are drawn too (Gemma's start
    at 0, i.e. a scale of 1), and its weights are large enough for logits of a few units."""
    tokenizer = build_tokenizer()
    config = gemma3_config(**{
        "vocab_size": len(tokenizer), "num_hidden_layers": len(layer_types),
        "query_pre_attn_scalar": 16, "sliding_window": window, "layer_types": list(layer_types),
        "final_logit_softcapping": 3.0, "initializer_range": 0.2,
        "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id, **config,
    })  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3)
    return model, tokenizer


def load(tiny_lm_dir, arch):
    """A fresh copy of the tiny `arch` model and its tokenizer."""
    return tiny_gemma3() if arch == "gemma3" else load_tiny_causal_lm(tiny_lm_dir(arch))


def rows_of(tokenizer, prompts):
    return [tokenizer(p)["input_ids"] for p in prompts]


def cacheless_sample(model, rows, settings, seed):
    """Reference: full forward over every row's whole sequence before each token; no cache."""
    torch.manual_seed(seed)
    seqs = [list(r) for r in rows]
    for _ in range(settings.max_new_tokens):
        logits = torch.stack([model(input_ids=torch.tensor([s])).logits[0, -1] for s in seqs])
        token = choose_tokens(
            logits, settings.do_sample, settings.temperature, settings.top_k, settings.top_p
        )
        for s, t in zip(seqs, token.tolist(), strict=True):
            s.append(t)
    return [s[len(r) :] for s, r in zip(seqs, rows, strict=True)]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_sampling_equals_a_cacheless_loop_with_left_padding(tiny_lm_dir, arch):
    """Ragged, left-padded prompts sampled with temperature, top-k and top-p draw exactly the
    tokens a loop without cache or padding draws from the same seed (no row ends here)."""
    model, tokenizer = load(tiny_lm_dir, arch)
    model.eval()
    rows = rows_of(tokenizer, PROMPTS)
    settings = GenerationSettings(max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.9)
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        torch.manual_seed(11)
        got = LeanDecoder(model).decode(ids, mask, settings, eos_ids=())
        want = cacheless_sample(model, rows, settings, seed=11)
    assert got == want
    assert len({tuple(r) for r in got}) > 1  # rows differ: the draws are not degenerate


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_shared_prefill_draws_what_an_unshared_loop_draws(tiny_lm_dir, arch):
    """Rows repeated G times (groups interleaved, ragged, left-padded; one prompt that is
    another one behind a real pad token) prefill each distinct row once and draw the very
    tokens of the unshared loop and of a cacheless loop, from the same seed."""
    model, tokenizer = load(tiny_lm_dir, arch)
    model.eval()
    b = rows_of(tokenizer, ["b"])[0]
    distinct = [*rows_of(tokenizer, PROMPTS), [tokenizer.pad_token_id, *b]]  # "b" is one of them
    rows = [row for _ in range(3) for row in distinct]  # (3 * 5,) each row 3 times, not adjacent
    settings = GenerationSettings(max_new_tokens=6, temperature=0.7, top_k=20, top_p=0.9)
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    got, prefilled = {}, []
    for share in (True, False):
        decoder = LeanDecoder(model, share_prefill=share)
        decoder.step = lambda ids, *args, step=decoder.step: (
            prefilled.append(ids.shape) or step(ids, *args)
        )
        with torch.no_grad():
            torch.manual_seed(11)
            got[share] = decoder.decode(ids, mask, settings, eos_ids=())
    with torch.no_grad():
        want = cacheless_sample(model, rows, settings, seed=11)
    assert got[True] == got[False] == want
    assert prefilled[0] == (len(distinct), ids.shape[1])  # shared: each distinct row once
    assert (len(rows), ids.shape[1]) in prefilled  # unshared: every row
    assert got[True][0] != got[True][len(distinct)]  # a prompt's copies draw their own tokens


def greedy_pair(model, tokenizer, rows, settings, eos_ids):
    """(lean, generate) greedy completions, both cut by split_completion."""
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        lean = LeanDecoder(model).decode(ids, mask, settings, eos_ids)
        ref = sample_token_ids(model, tokenizer, rows, settings, eos_ids, 0).token_ids
    cut = [split_completion(r, set(eos_ids), (), tokenizer)[0] for r in ref]
    return lean, cut


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_greedy_equals_generate_as_rows_end_at_different_steps(tiny_lm_dir, arch):
    """With EOS ids that end rows at different steps (finished rows leave the batch), greedy
    decoding gives generate's completions exactly, EOS kept."""
    model, tokenizer = load(tiny_lm_dir, arch)
    model.eval()
    rows = rows_of(tokenizer, PROMPTS)
    settings = GenerationSettings(max_new_tokens=12, do_sample=False)
    free, _ = greedy_pair(model, tokenizer, rows, settings, [tokenizer.eos_token_id])
    eos = sorted({free[0][2], free[2][5]})  # row 0 ends at step 3 or earlier, row 2 by step 6
    lean, want = greedy_pair(model, tokenizer, rows, settings, eos)
    assert lean == want
    lengths = [len(r) for r in lean]
    assert min(lengths) <= 3 and max(lengths) > min(lengths)


def test_lora_adapters_are_applied(tiny_lm_dir):
    """A LoRA model with non-zero adapters decodes greedily as generate does, and not as the base."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    base_rows = rows_of(tokenizer, PROMPTS)
    settings = GenerationSettings(max_new_tokens=8, do_sample=False)
    base, _ = greedy_pair(model.eval(), tokenizer, base_rows, settings, [tokenizer.eos_token_id])
    model = apply_lora(model, LoraSettings(r=4, alpha=8)).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    lean, want = greedy_pair(model, tokenizer, base_rows, settings, [tokenizer.eos_token_id])
    assert lean == want and lean != base


def test_self_check_passes_and_catches_a_wrong_loop(tiny_lm_dir):
    """The check's gap is at fp32 rounding; a loop without rotary embedding fails it."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    decoder = LeanDecoder(model.eval())
    probe = rows_of(tokenizer, PROMPTS)[2]
    with torch.no_grad():
        assert decoder.check(model, probe) < 1e-6
        decoder.rope = lambda q, k, cos, sin: (q, k)
        with pytest.raises(RuntimeError, match="rollout.engine 'lean': its logits differ"):
            decoder.check(model, probe)


def test_bfloat16_model_passes_the_self_check(tiny_lm_dir):
    """In bfloat16 the loop's logits stay within the half-precision tolerance of the forward."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        assert LeanDecoder(model).check(model, rows_of(tokenizer, PROMPTS)[0]) < 5e-2


def test_unsupported_models_are_refused(tiny_lm_dir, tmp_path):
    """GPT-2 is refused by name; a sliding window shorter than prompt + completion is refused."""
    model, _ = load_tiny_causal_lm(tiny_lm_dir("gpt2"))
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported; allowed: llama"):
        LeanDecoder(model)
    config = MistralConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
    )  # fmt: skip
    mistral = AutoModelForCausalLM.from_config(config).eval()
    decoder = LeanDecoder(mistral)
    ids = torch.tensor([[3, 4, 5]])
    settings = GenerationSettings(max_new_tokens=5, do_sample=False)
    assert len(decoder.decode(ids, torch.ones_like(ids), settings, ())[0]) == 5  # 8 fits
    with pytest.raises(ValueError, match="exceeds the model's sliding attention window of 8"):
        decoder.decode(ids, torch.ones_like(ids), settings.replace(max_new_tokens=6), ())


def policy_with(loaded, engine, precision="fp32", **generation):
    """A CausalLMPolicy over loaded = (model, tokenizer), sampling with `engine`."""
    model, tokenizer = loaded
    settings = GenerationSettings(**{"max_new_tokens": 8, **generation})
    rollout = RolloutSettings(engine=engine, precision=precision)
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(settings), rollout=rollout)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_policy_completions_match_the_transformers_engine(tiny_lm_dir, arch):
    """Through CausalLMPolicy (greedy, a stop string, chat-free prompts): the same completions,
    masks and flags as the default engine, and the model's training mode restored."""
    states = [{"prompt": p} for p in PROMPTS]
    plain = policy_with(load(tiny_lm_dir, arch), "transformers", do_sample=False)
    text = plain.generate_actions(states, 1)[0][0].text
    stop = text.split()[1] if len(text.split()) > 1 else text[:2]
    results = {}
    for engine in ("transformers", "lean"):
        loaded = load(tiny_lm_dir, arch)
        policy = policy_with(loaded, engine, do_sample=False, stop_strings=(stop,))
        policy.train()
        groups = policy.generate_actions(states, 2)
        assert policy.model.training
        results[engine] = [
            (c.completion_ids, c.text, c.truncated, c.finished_by_eos) for g in groups for c in g
        ]
    assert isinstance(policy.rollout_engine, LeanEngine) and policy.rollout_engine.check_gap < 1e-6
    assert results["lean"] == results["transformers"]
    assert any(stop in t for _, t, _, _ in results["lean"])


def _lean_step(tiny_lm_dir, **config):
    """One GRPO step (SGD, lr 0.1) with the lean engine from the same start and sampling
    seed: the parameters after it, and whether each scoring pass ran with gradients."""
    policy = policy_with(load(tiny_lm_dir, "llama"), "lean", temperature=1.0, seed=3)
    assert policy.sampler_is_scorer
    calls = []
    score = policy.get_token_log_probabilities
    policy.get_token_log_probabilities = lambda s, a: (
        calls.append(torch.is_grad_enabled()) or score(s, a)
    )
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    config = GRPOConfig(group_size=4, batch_size=8, num_epochs_per_update=1,
                        ref_update_frequency=0, kl_coeff=0.0, **config)  # fmt: skip
    trainer = GRPOTrainer(policy, reward, optimizer=optimizer, config=config)
    trainer.train_step([{"prompt": p} for p in PROMPTS[:2]])
    assert policy.rollout_metrics["completion/length_mean"] > 0
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}, calls


def test_grpo_step_with_the_lean_engine_skips_the_old_pass(tiny_lm_dir):
    """The lean engine samples with the scorer's model, so a GRPO step at μ = 1 runs no no-grad
    old-log-prob pass, and its update is the one the step with that pass makes (1e-6)."""
    skipped, calls = _lean_step(tiny_lm_dir)
    assert calls and all(calls)  # every scoring pass is the gradient one: no no-grad old pass
    full, full_calls = _lean_step(tiny_lm_dir, skip_redundant_old_logprobs=False)
    assert False in full_calls  # the old pass ran there
    start = dict(load(tiny_lm_dir, "llama")[0].named_parameters())
    assert max((full[n] - start[n]).abs().max().item() for n in full) > 1e-4  # it moved
    for name in full:
        torch.testing.assert_close(skipped[name], full[name], rtol=0, atol=1e-6)


def test_gemma3_logits_equal_the_forward_at_every_token():
    """Left-padded Gemma 3 rows (sliding and full layers, logits soft-capped or not): the logits
    of every step equal the plain forward over the unpadded row and its tokens so far."""
    for cap in (3.0, None):
        model, tokenizer = tiny_gemma3(final_logit_softcapping=cap)
        model.eval()
        rows = rows_of(tokenizer, PROMPTS)
        ids, mask = left_pad(rows, tokenizer.pad_token_id)
        settings = GenerationSettings(max_new_tokens=6, temperature=1.0)
        steps = []  # (n, V) per step
        with torch.no_grad():
            torch.manual_seed(3)
            new = LeanDecoder(model).decode(ids, mask, settings, (), logits_out=steps)
            for r, (row, tokens) in enumerate(zip(rows, new, strict=True)):
                full = torch.tensor([row + tokens[:-1]])  # (1, P_r + 5)
                want = model(input_ids=full).logits[0, len(row) - 1 :]  # (6, V)
                got = torch.stack([s[r] for s in steps])  # (6, V)
                assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        if cap is not None:
            assert want.abs().max() < cap  # the cap holds here: it was applied


def llama_wiring(decoder):
    decoder.family = dataclasses.replace(decoder.family, block=FAMILIES["llama"].block)


def one_rotary_base(decoder):
    decoder.kind_of = [decoder.kinds.index(FULL)] * len(decoder.kind_of)


def uncapped_logits(decoder):
    decoder.family = dataclasses.replace(decoder.family, cap_logits=FAMILIES["llama"].cap_logits)


def one_norm_off(decoder):
    # the decoder over a copy whose query norm differs: its model is no longer the checked one
    body = copy.deepcopy(decoder.body)
    with torch.no_grad():
        body.layers[1].self_attn.q_norm.weight.add_(0.5)
    decoder.body = body


@pytest.mark.parametrize("corrupt", [llama_wiring, one_rotary_base, uncapped_logits, one_norm_off])
def test_gemma3_self_check_fails_on_each_departure(corrupt):
    """The self-check passes at fp32 rounding on Gemma 3 and raises when the loop leaves out one
    of its differences: the norms after each sub-layer, the local rotary base, the logit cap,
    or one norm's weight."""
    model, tokenizer = tiny_gemma3()
    decoder = LeanDecoder(model.eval())
    probe = rows_of(tokenizer, PROMPTS)[2]
    with torch.no_grad():
        assert decoder.check(model, probe) < 1e-6
        corrupt(decoder)
        with pytest.raises(RuntimeError, match="rollout.engine 'lean': its logits differ"):
            decoder.check(model, probe)


def test_gemma3_sampled_rollouts_repeat_under_a_seed():
    """Through the policy, the lean engine's sampled Gemma 3 completions are the same from the
    same generation seed in two fresh policies, and differ under another seed."""
    states = [{"prompt": p} for p in PROMPTS]

    def sampled(seed):
        policy = policy_with(tiny_gemma3(), "lean", temperature=1.0, seed=seed)
        groups = policy.generate_actions(states, 3)
        assert policy.rollout_engine.check_gap < 1e-6
        return [c.completion_ids for g in groups for c in g]

    first = sampled(5)
    assert sampled(5) == first
    assert sampled(6) != first


def test_gemma3_bf16_rollouts_pass_the_self_check():
    """Under rollout.precision bf16-mixed, Gemma 3's bfloat16 copy (scaled embedding and tied
    output layer included) stays within the half-precision tolerance of the fp32 forward."""
    policy = policy_with(tiny_gemma3(), "lean", precision="bf16-mixed", temperature=1.0, seed=0)
    groups = policy.generate_actions([{"prompt": p} for p in PROMPTS], 2)
    assert len(groups) == len(PROMPTS)
    assert policy.rollout_engine.low is not None and policy.rollout_engine.check_gap < 5e-2


def test_gemma3_window_is_its_sliding_layers():
    """A Gemma 3 with a window of 8 on its sliding layers decodes 8 tokens of prompt +
    completion and refuses 9; with full layers only, the same window setting limits nothing
    (past 8 tokens its logits still equal the forward)."""
    model, _ = tiny_gemma3(window=8)
    decoder = LeanDecoder(model.eval())
    ids = torch.tensor([[3, 4, 5]])
    settings = GenerationSettings(max_new_tokens=5, do_sample=False)
    with torch.no_grad():
        assert len(decoder.decode(ids, torch.ones_like(ids), settings, ())[0]) == 5
        with pytest.raises(ValueError, match="sliding attention window of 8"):
            decoder.decode(ids, torch.ones_like(ids), settings.replace(max_new_tokens=6), ())
        full, _ = tiny_gemma3(window=8, layer_types=(FULL, FULL))
        decoder = LeanDecoder(full.eval())
        assert decoder.window is None
        assert decoder.check(full, list(range(3, 15))) < 1e-6  # 12 + 3 tokens


def test_gemma3_soft_capped_attention_is_refused():
    """Soft-capped attention scores (which scaled dot-product attention cannot apply) are
    refused by name, as is bidirectional attention."""
    model, _ = tiny_gemma3(attn_logit_softcapping=50.0)
    with pytest.raises(ValueError, match="attn_logit_softcapping = 50.0"):
        LeanDecoder(model)
    model, _ = tiny_gemma3(use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        LeanDecoder(model)
