"""Tests for the lean rollout engine (grpo.lm.engines.lean).

The references are independent: transformers' own logits warpers, `generate`
with greedy decoding, and a loop without any cache that runs the model's full
forward over the whole sequence before every token.
"""

import pytest
import torch
from tiny_models import load_tiny_causal_lm
from transformers import AutoModelForCausalLM, MistralConfig

from grpo.config import GRPOConfig
from grpo.functional.sampling import choose_tokens
from grpo.lm.engines import RolloutSettings
from grpo.lm.engines.lean import LeanDecoder, LeanEngine
from grpo.lm.engines.transformers import sample_token_ids
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings, left_pad, split_completion
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer

PROMPTS = ["say a b c", "count", "one two three four five", "b"]
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


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_sampling_equals_a_cacheless_loop_with_left_padding(tiny_lm_dir, arch):
    """Ragged, left-padded prompts sampled with temperature, top-k and top-p draw exactly the
    tokens a loop without cache or padding draws from the same seed (no row ends here)."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
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


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_shared_prefill_draws_what_an_unshared_loop_draws(tiny_lm_dir, arch):
    """Rows repeated G times (groups interleaved, ragged, left-padded; one prompt that is
    another one behind a real pad token) prefill each distinct row once and draw the very
    tokens of the unshared loop and of a cacheless loop, from the same seed."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
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


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_equals_generate_as_rows_end_at_different_steps(tiny_lm_dir, arch):
    """With EOS ids that end rows at different steps (finished rows leave the batch), greedy
    decoding gives generate's completions exactly, EOS kept."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir(arch))
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


def policy_with(path, engine, **generation):
    model, tokenizer = load_tiny_causal_lm(path)
    settings = GenerationSettings(**{"max_new_tokens": 8, **generation})
    return CausalLMPolicy(
        model, tokenizer, CausalLMSettings(settings), rollout=RolloutSettings(engine=engine)
    )


def test_policy_completions_match_the_transformers_engine(tiny_lm_dir):
    """Through CausalLMPolicy (greedy, a stop string, chat-free prompts): the same completions,
    masks and flags as the default engine, and the model's training mode restored."""
    states = [{"prompt": p} for p in PROMPTS]
    plain = policy_with(tiny_lm_dir("qwen2"), "transformers", do_sample=False)
    text = plain.generate_actions(states, 1)[0][0].text
    stop = text.split()[1] if len(text.split()) > 1 else text[:2]
    results = {}
    for engine in ("transformers", "lean"):
        policy = policy_with(tiny_lm_dir("qwen2"), engine, do_sample=False, stop_strings=(stop,))
        policy.train()
        groups = policy.generate_actions(states, 2)
        assert policy.model.training
        results[engine] = [
            (c.completion_ids, c.text, c.truncated, c.finished_by_eos) for g in groups for c in g
        ]
    assert isinstance(policy.rollout_engine, LeanEngine) and policy.rollout_engine.check_gap < 1e-6
    assert results["lean"] == results["transformers"]
    assert any(stop in t for _, t, _, _ in results["lean"])


def test_grpo_step_with_the_lean_engine_skips_the_old_pass(tiny_lm_dir):
    """The lean engine samples with the scorer's model, so a GRPO step at μ = 1 runs no no-grad
    old-log-prob pass, and the update changes the weights."""
    policy = policy_with(tiny_lm_dir("llama"), "lean", temperature=1.0)
    assert policy.sampler_is_scorer
    calls = []
    score = policy.get_token_log_probabilities
    policy.get_token_log_probabilities = lambda s, a: (
        calls.append(torch.is_grad_enabled()) or score(s, a)
    )
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    config = GRPOConfig(
        group_size=4, batch_size=8, num_epochs_per_update=1, ref_update_frequency=0, kl_coeff=0.0
    )
    before = [p.detach().clone() for p in policy.model.parameters()]
    trainer = GRPOTrainer(policy, reward, optimizer=optimizer, config=config)
    trainer.train_step([{"prompt": p} for p in PROMPTS[:2]])
    assert calls and all(calls)  # every scoring pass is the gradient one: no no-grad old pass
    assert policy.rollout_metrics["completion/length_mean"] > 0
    assert any(
        not torch.equal(a, b) for a, b in zip(before, policy.model.parameters(), strict=True)
    )
