"""Tests for grpo.lm.policy (with sampling.py, loading.py, reference.py, completion.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import ARCHS, BASE_ARCHS, load_tiny_causal_lm

from grpo.config import GRPOConfig
from grpo.lm.completion import Completion
from grpo.lm.loading import LoraSettings, apply_lora
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.reference import AdapterDisabledReference
from grpo.lm.sampling import GenerationSettings, split_completion
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer


def make_policy(path, temperature=1.0, **settings) -> CausalLMPolicy:
    model, tokenizer = load_tiny_causal_lm(path)
    generation = GenerationSettings(
        max_new_tokens=settings.pop("max_new_tokens", 6), temperature=temperature
    )
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(generation, **settings))


def words(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def manual_logprobs(model, prompt_ids, completion_ids, temperature):
    """log softmax(logits / temperature) gathered at each completion token, no padding at all."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    logits = model(input_ids=ids).logits[0].double() / temperature  # (P+T, V)
    P, T = len(prompt_ids), len(completion_ids)
    logp = torch.log_softmax(logits[P - 1 : P + T - 1], dim=-1)  # (T, V) row t scores token P+t
    probs = logp.exp()
    entropy = -(probs * logp).sum(-1)  # (T,)
    return logp[torch.arange(T), torch.tensor(completion_ids)], entropy


def sample_completions(tokenizer):
    """Three completions of different lengths behind prompts of different lengths."""
    eos = tokenizer.eos_token_id
    specs = [
        ("say a", "yes no red", True),
        ("write b c d e f g", "blue", False),
        ("count", "a b c d", True),
    ]
    out = []
    for prompt, completion, ends in specs:
        ids = words(tokenizer, " " + completion) + ([eos] if ends else [])
        out.append(
            Completion(
                completion, ids, words(tokenizer, prompt), truncated=False, finished_by_eos=ends
            )
        )
    return out


@pytest.mark.parametrize("arch", ARCHS + BASE_ARCHS)  # Gemma 3: past its sliding window
def test_logprobs_match_independent_forward(tiny_lm_dir, arch):
    """Micro-batched, padded policy log-probs and entropy equal an unpadded forward + own gather."""
    policy = make_policy(tiny_lm_dir(arch), temperature=0.7, micro_batch_size=2).eval()
    actions = sample_completions(policy.tokenizer)
    with torch.no_grad():
        out = policy.get_token_log_probabilities([{"prompt": "x"}] * 3, actions)
        for n, a in enumerate(actions):
            expected, entropy = manual_logprobs(policy.model, a.prompt_ids, a.completion_ids, 0.7)
            T = a.num_tokens
            torch.testing.assert_close(out.logprobs[n, :T].double(), expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.entropy[n, :T].double(), entropy, rtol=1e-5, atol=1e-5)
            assert out.completion_mask[n].tolist() == [True] * T + [False] * (
                out.logprobs.shape[1] - T
            )
        per_sample = policy.get_log_probabilities([{"prompt": "x"}] * 3, actions)
    torch.testing.assert_close(per_sample, out.logprobs.sum(-1))


@pytest.mark.parametrize("arch", ARCHS + BASE_ARCHS)  # Gemma 3: past its sliding window
def test_left_padding_equals_no_padding(tiny_lm_dir, arch):
    """A short prompt scored beside a much longer one (left padding) gives its unpadded log-probs."""
    policy = make_policy(tiny_lm_dir(arch), micro_batch_size=4).eval()
    tok = policy.tokenizer
    short = Completion(
        "a b", words(tok, " a b") + [tok.eos_token_id], words(tok, "say"), False, True
    )
    long = Completion(
        "c", words(tok, " c"), words(tok, "write a b c d e f g h i j k"), False, False
    )
    with torch.no_grad():
        alone = policy.get_token_log_probabilities(["x"], [short]).logprobs  # (1, 3) no padding
        batched = policy.get_token_log_probabilities(["x", "y"], [long, short]).logprobs  # (2, 3)
    torch.testing.assert_close(batched[1], alone[0], rtol=0, atol=1e-5)


def test_log_probs_use_the_sampling_temperature(tiny_lm_dir):
    """Scoring divides logits by the sampling temperature: T=0.5 differs from T=1 and matches the manual value."""
    hot, cold = (
        make_policy(tiny_lm_dir("qwen2"), 1.0).eval(),
        make_policy(tiny_lm_dir("qwen2"), 0.5).eval(),
    )
    action = sample_completions(hot.tokenizer)[0]
    with torch.no_grad():
        lp_hot = hot.get_token_log_probabilities(["x"], [action]).logprobs[0]
        lp_cold = cold.get_token_log_probabilities(["x"], [action]).logprobs[0]
        expected, _ = manual_logprobs(cold.model, action.prompt_ids, action.completion_ids, 0.5)
    torch.testing.assert_close(lp_cold.double(), expected, rtol=1e-5, atol=1e-5)
    assert (lp_hot - lp_cold).abs().max() > 1e-3


def test_tokens_after_eos_carry_no_loss_and_no_gradient(tiny_lm_dir):
    """Tokens after the first EOS are masked, score 0, and changing them leaves the gradient unchanged."""
    policy = make_policy(tiny_lm_dir("llama"))
    tok, eos = policy.tokenizer, policy.tokenizer.eos_token_id
    prompt = words(tok, "say a")
    grads = []
    for tail in (" red blue", " yes no"):
        ids = words(tok, " a b") + [eos] + words(tok, tail)
        action = Completion("a b", ids, prompt, truncated=False, finished_by_eos=True)
        policy.model.zero_grad()
        out = policy.get_token_log_probabilities(["x"], [action])
        assert out.completion_mask[0].tolist() == [True, True, True, False, False]
        assert out.logprobs[0, 3:].tolist() == [0.0, 0.0]
        out.logprobs.sum().backward()
        grads.append(
            torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])
        )
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-7)


def test_truncated_completions_can_be_dropped_from_the_loss(tiny_lm_dir):
    """mask_truncated_completions gives a truncated completion an all-False mask, others unchanged."""
    policy = make_policy(tiny_lm_dir("qwen2"), mask_truncated_completions=True)
    tok = policy.tokenizer
    cut = Completion(
        "a b", words(tok, " a b"), words(tok, "say"), truncated=True, finished_by_eos=False
    )
    done = Completion("a", words(tok, " a") + [tok.eos_token_id], words(tok, "say"), False, True)
    mask = policy.get_token_log_probabilities(["x", "x"], [cut, done]).completion_mask
    assert mask.tolist() == [[False, False], [True, True]]


@pytest.mark.parametrize("masked", [False, True])
@torch.no_grad()
def test_loss_token_counts_equal_the_scored_masks(tiny_lm_dir, masked):
    """The trainer takes the loss denominator from loss_token_counts and the numerator from
    the scored completion_mask: they count the same tokens, row by row, for a completion with
    tokens after its EOS, one cut at the token limit (masked or not), one ended by EOS and
    an empty one."""
    policy = make_policy(tiny_lm_dir("qwen2"), mask_truncated_completions=masked)
    tok, eos = policy.tokenizer, policy.tokenizer.eos_token_id
    prompt = words(tok, "say")
    actions = [
        Completion("a b", words(tok, " a b") + [eos] + words(tok, " red"), prompt, False, True),
        Completion("a b c", words(tok, " a b c"), prompt, truncated=True, finished_by_eos=False),
        Completion("a", words(tok, " a") + [eos], prompt, truncated=False, finished_by_eos=True),
        Completion("", [], prompt, truncated=False, finished_by_eos=False),
    ]
    counts = policy.loss_token_counts(["x"] * 4, actions)
    mask = policy.get_token_log_probabilities(["x"] * 4, actions).completion_mask
    assert counts.tolist() == mask.sum(1).tolist() == [3, 0 if masked else 3, 2, 0]


def test_generate_groups_modes_and_masks(tiny_lm_dir):
    """G contiguous completions per state, sampled in eval mode without grad, train mode restored."""
    policy = make_policy(tiny_lm_dir("gpt2"), max_new_tokens=5).train()
    seen = []
    hook = policy.model.register_forward_hook(
        lambda module, args, output: seen.append((module.training, torch.is_grad_enabled()))
    )
    states = [{"prompt": "say a b", "answer": 1}, [{"role": "user", "content": "write c"}]]
    groups = policy.generate_actions(states, 3)
    hook.remove()
    assert policy.training and seen and set(seen) == {(False, False)}
    assert [len(g) for g in groups] == [3, 3]
    tok = policy.tokenizer
    chat = tok.apply_chat_template(states[1], tokenize=False, add_generation_prompt=True)
    assert all(c.prompt_ids == tuple(words(tok, "say a b")) for c in groups[0])
    assert all(
        c.prompt_ids == tuple(tok(chat, add_special_tokens=False)["input_ids"]) for c in groups[1]
    )
    flat = [c for g in groups for c in g]
    mask = policy.get_token_log_probabilities([None] * 6, flat).completion_mask
    for n, c in enumerate(flat):
        assert c.finished_by_eos == (c.completion_ids[-1] == tok.eos_token_id)
        assert c.truncated == (not c.finished_by_eos and c.num_tokens == 5)
        assert mask[n].sum() == c.num_tokens and c.text == tok.decode(
            c.completion_ids, skip_special_tokens=True
        )


def test_sampling_is_seeded_and_leaves_global_rng_alone(tiny_lm_dir):
    """Two policies with the same seed sample identical completions; the global RNG is untouched."""
    a, b = make_policy(tiny_lm_dir("qwen2")), make_policy(tiny_lm_dir("qwen2"))
    before = torch.get_rng_state()
    first = a.generate_actions(["say a", "count"], 4)
    assert torch.equal(torch.get_rng_state(), before)
    assert first == b.generate_actions(["say a", "count"], 4)
    assert first != a.generate_actions(["say a", "count"], 4)  # the next call uses the next seed


def test_stop_strings_end_completions(tiny_lm_dir):
    """A completion ends with the first token whose text completes a stop string, and is not truncated."""
    policy = make_policy(tiny_lm_dir("qwen2"), max_new_tokens=12)
    policy.settings.generation = policy.settings.generation.replace(stop_strings=("e",))
    flat = [c for g in policy.generate_actions(["say a", "count"], 4) for c in g]
    stopped = [c for c in flat if not c.finished_by_eos and not c.truncated]
    assert stopped, "some completion should have hit the stop string"
    for c in stopped:
        assert "e" in policy.tokenizer.decode(c.completion_ids)
        assert "e" not in policy.tokenizer.decode(c.completion_ids[:-1])
    tok = policy.tokenizer
    ids = words(tok, " red yes blue") + [tok.eos_token_id]
    assert split_completion(ids, {tok.eos_token_id}, ("yes",), tok) == (ids[:2], False, True)
    assert split_completion(ids, {tok.eos_token_id}, (), tok) == (ids, True, False)


def test_frozen_reference_never_changes_during_training(tiny_lm_dir):
    """The reference's log-probs stay fixed over GRPO steps while the policy's move."""
    policy = make_policy(tiny_lm_dir("qwen2"), max_new_tokens=4)
    reward = TextReward(lambda prompts, completions: [float(len(c)) for c in completions])
    config = GRPOConfig(
        group_size=4,
        batch_size=8,
        num_epochs_per_update=1,
        kl_coeff=0.1,
        ref_update_frequency=0,
        learning_rate=1e-2,
    )
    trainer = GRPOTrainer(policy, reward, config=config)
    reference = trainer.reference_policy
    assert not reference.training and not any(p.requires_grad for p in reference.model.parameters())
    actions = sample_completions(policy.tokenizer)
    with torch.no_grad():
        ref_before = reference.get_token_log_probabilities([None] * 3, actions).logprobs
        pol_before = policy.get_token_log_probabilities([None] * 3, actions).logprobs
    for _ in range(2):
        trainer.train_step(["say a", "count b"])
    with torch.no_grad():
        ref_after = reference.get_token_log_probabilities([None] * 3, actions).logprobs
        pol_after = policy.get_token_log_probabilities([None] * 3, actions).logprobs
    assert trainer.reference_policy is reference and torch.equal(ref_before, ref_after)
    assert (pol_after - pol_before).abs().max() > 1e-4


def test_lora_reference_is_the_base_with_adapters_disabled(tiny_lm_dir):
    """LoRA: the reference view equals a frozen copy at step 0, holds no weights, and stays put after a step."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    frozen = copy.deepcopy(model).eval()
    policy = CausalLMPolicy(apply_lora(model, LoraSettings(r=4, alpha=8)), tokenizer)
    reference = policy.make_reference()
    assert isinstance(reference, AdapterDisabledReference) and not isinstance(
        reference, torch.nn.Module
    )
    assert reference.get_parameters() == {} and all("lora" in n for n in policy.get_parameters())
    actions = sample_completions(tokenizer)
    T = max(a.num_tokens for a in actions)
    with torch.no_grad():
        expected = torch.stack(
            [
                torch.nn.functional.pad(
                    manual_logprobs(frozen, a.prompt_ids, a.completion_ids, 1.0)[0],
                    (0, T - a.num_tokens),
                )
                for a in actions
            ]
        ).float()
    ref0 = reference.get_token_log_probabilities([None] * 3, actions).logprobs
    torch.testing.assert_close(ref0, expected, rtol=1e-5, atol=1e-5)
    optimizer = torch.optim.SGD(list(policy.get_parameters().values()), lr=1.0)
    loss = -policy.get_token_log_probabilities([None] * 3, actions).logprobs.sum()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        pol1 = policy.get_token_log_probabilities([None] * 3, actions).logprobs
    ref1 = reference.get_token_log_probabilities([None] * 3, actions).logprobs
    torch.testing.assert_close(ref1, expected, rtol=1e-5, atol=1e-5)
    assert (pol1 - ref1).abs().max() > 1e-3


@pytest.mark.parametrize("lora", [False, True])
def test_a_reference_scores_log_probs_without_the_entropy(tiny_lm_dir, lora):
    """The loss reads only π_ref's log-probs: a reference (a frozen copy, or the LoRA base)
    skips the entropy over the vocabulary that its policy computes, and its log-probs are
    the policy's own at step 0."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    if lora:
        model = apply_lora(model, LoraSettings(r=4, alpha=8))
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=4), compute_entropy=True)
    policy = CausalLMPolicy(model, tokenizer, settings)
    actions = sample_completions(tokenizer)
    with torch.no_grad():
        own = policy.get_token_log_probabilities([None] * 3, actions)
        ref = policy.make_reference().get_token_log_probabilities([None] * 3, actions)
    assert own.entropy is not None and ref.entropy is None
    torch.testing.assert_close(ref.logprobs, own.logprobs, rtol=1e-6, atol=1e-6)


def test_gradient_checkpointing_gives_the_same_gradient(tiny_lm_dir):
    """Gradient checkpointing changes memory, not the log-probs or their gradient."""
    results = []
    for checkpointing in (False, True):
        policy = make_policy(tiny_lm_dir("llama"), gradient_checkpointing=checkpointing).train()
        out = policy.get_token_log_probabilities([None] * 3, sample_completions(policy.tokenizer))
        out.logprobs.sum().backward()
        grad = torch.cat(
            [p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]
        )
        results.append((out.logprobs.detach(), grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)


def test_bad_inputs_fail_clearly(tiny_lm_dir, tmp_path):
    """Too-long prompt, missing model folder, missing pad token, non-Completion action: each handled."""
    policy = make_policy(tiny_lm_dir("gpt2"))
    with pytest.raises(ValueError, match=r"state 1: prompt of \d+ tokens .* context of 64"):
        policy.generate_actions(["say a", " ".join(["a"] * 70)], 2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CausalLMPolicy.from_pretrained(str(tmp_path / "no-such-model"))
    half = tmp_path / "weights-only"  # a folder missing what save_pretrained writes
    half.mkdir()
    (half / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer file \(one of tokenizer.json"):
        CausalLMPolicy.from_pretrained(str(half))
    (half / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no config.json \(nor a LoRA adapter's adapter_config.json\) and no tokenizer"):
        CausalLMPolicy.from_pretrained(str(half))
    with pytest.warns(UserWarning, match="no pad token"):
        unpadded = CausalLMPolicy.from_pretrained(
            str(tiny_lm_dir("llama", with_pad=False)), policy.settings
        )
    assert unpadded.tokenizer.pad_token_id == unpadded.tokenizer.eos_token_id
    assert len(unpadded.generate_actions(["say a", "write b c d"], 2)) == 2
    with pytest.raises(TypeError, match="action 0: got str"):
        policy.get_token_log_probabilities(["x"], ["a b"])
    with pytest.raises(ValueError, match="state 0: a dict state needs a 'prompt' key"):
        policy.generate_actions([{"question": "a"}], 2)


# every dropout each architecture's config exposes, at 0.5
DROPOUTS = {
    "qwen2": {"attention_dropout": 0.5},
    "llama": {"attention_dropout": 0.5},
    "gpt2": {"attn_pdrop": 0.5, "resid_pdrop": 0.5, "embd_pdrop": 0.5},
}


@pytest.mark.parametrize("arch", ARCHS)
def test_disable_dropout_turns_off_attention_dropout(tiny_lm_dir, arch):
    """Dropout 0.5 in the config (attention included): with disable_dropout the training-mode
    gradient pass scores what the eval-mode rollout scored, so the first epoch's ratio is 1."""
    from transformers import AutoModelForCausalLM

    path = tiny_lm_dir(arch)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **DROPOUTS[arch])
    _, tokenizer = load_tiny_causal_lm(path)
    policy = CausalLMPolicy(
        model, tokenizer, CausalLMSettings(GenerationSettings(max_new_tokens=4))
    )
    assert all(getattr(model.config, name) == 0.0 for name in DROPOUTS[arch])
    actions = sample_completions(tokenizer)
    states = ["say a", "write b c d e f g", "count"]
    with torch.no_grad():
        model.eval()
        old = policy.get_token_log_probabilities(states, actions).logprobs
    model.train()
    new = policy.get_token_log_probabilities(states, actions).logprobs
    assert torch.equal((new - old.detach()).exp(), torch.ones_like(new))
