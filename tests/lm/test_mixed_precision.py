"""bf16-mixed for causal-LM policies: scoring, the engines as samplers, updates, resume."""

from __future__ import annotations

import pytest
import torch
from tiny_models import load_tiny_causal_lm

import grpo.precision
from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.precision import update_stall_share
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer

PROMPTS = [{"prompt": p} for p in ("say a b c", "count", "one two three four five", "b")]
REWARD = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])


def policy_with(path, precision="fp32", engine="transformers", dtype=None, sampler=None, cap=None):
    model, tokenizer = load_tiny_causal_lm(path)
    if dtype is not None:
        model = model.to(dtype)
    settings = CausalLMSettings(
        GenerationSettings(max_new_tokens=6, temperature=1.0, seed=3), precision=precision
    )
    return CausalLMPolicy(
        model, tokenizer, settings, RolloutSettings(engine, precision=sampler, tis_cap=cap)
    )


def sampled(policy, states=PROMPTS[:2], G=4):
    return [a for group in policy.generate_actions(states, G) for a in group]


@pytest.mark.parametrize("chunked", [False, True])
def test_bf16_mixed_scores_in_float32_within_bf16_rounding_of_fp32(tiny_lm_dir, chunked):
    """bf16-mixed log-probs are float32, within 0.05 of the fp32 ones, and give fp32 gradients
    within 5 % (relative norm) of fp32's, with the plain and the chunked output layer."""
    fp32 = policy_with(tiny_lm_dir("llama"))
    fp32.settings.chunked_output_layer = chunked
    actions = sampled(fp32)
    states = [s for s in PROMPTS[:2] for _ in range(4)]
    got = {}
    for precision in ("fp32", "bf16-mixed"):
        fp32.settings.precision = precision
        fp32.model.zero_grad()
        out = fp32.get_token_log_probabilities(states, actions)
        (out.logprobs * out.completion_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in fp32.model.parameters()])
        got[precision] = out.logprobs.detach(), grads
    (lp32, g32), (lp16, g16) = got["fp32"], got["bf16-mixed"]
    assert lp16.dtype == torch.float32 and g16.dtype == torch.float32
    assert 0 < (lp16 - lp32).abs().max() < 0.05
    assert (g16 - g32).norm() / g32.norm() < 0.05


def test_under_bf16_mixed_the_folded_output_layer_scores_as_the_models_own(tiny_lm_dir):
    """bf16-mixed: the folded output layer multiplies in bfloat16 as autocast does the model's
    own output layer, so the two give the same log-probs to the rounding of a product's
    summation order (a fold multiplying in fp32 is 7.6e-4 from the model's own here), and
    gradients within 0.5 % (the weight's gradient sums chunk by chunk in fp32, autocast's in
    one bfloat16 product); in fp32 they agree closer still."""
    policy = policy_with(tiny_lm_dir("llama"))
    actions = sampled(policy)
    states = [s for s in PROMPTS[:2] for _ in range(4)]
    gaps = {}
    for precision in ("fp32", "bf16-mixed"):
        policy.settings.precision = precision
        got = []
        for chunked in (False, True):
            policy.settings.chunked_output_layer = chunked
            policy.model.zero_grad()
            out = policy.get_token_log_probabilities(states, actions)
            (out.logprobs * out.completion_mask).sum().backward()
            grads = torch.cat([p.grad.flatten() for p in policy.model.parameters()])
            got.append((out.logprobs.detach(), grads))
        (plain, g_plain), (folded, g_folded) = got
        gaps[precision] = (
            (folded - plain).abs().max().item(),
            ((g_folded - g_plain).norm() / g_plain.norm()).item(),
        )
    assert gaps["fp32"][0] < 1e-5 and gaps["fp32"][1] < 1e-5, gaps
    assert gaps["bf16-mixed"][0] < 1e-4 and gaps["bf16-mixed"][1] < 5e-3, gaps


@pytest.mark.parametrize("engine", ["transformers", "lean"])
def test_a_sampler_in_another_precision_is_not_the_scorer_and_reports_the_gap(tiny_lm_dir, engine):
    """rollout.precision bf16-mixed under an fp32 scorer: sampler_is_scorer is False, every
    completion carries its sampler log-probs, the rollout gap is > 0 and < 0.05 per token, and
    rollout.tis_cap gives importance weights; the same precision on both sides gives none."""
    same = policy_with(tiny_lm_dir("llama"), "bf16-mixed", engine)
    assert same.sampler_is_scorer
    assert all(a.engine_logprobs is None for a in sampled(same))

    policy = policy_with(tiny_lm_dir("llama"), "fp32", engine, sampler="bf16-mixed", cap=2.0)
    assert not policy.sampler_is_scorer
    actions = sampled(policy)
    assert all(len(a.engine_logprobs) == a.num_tokens for a in actions)
    with torch.no_grad():
        old = policy.get_token_log_probabilities([None] * len(actions), actions)
    gap = policy.rollout_metrics["rollout/logprob_gap_max"]
    assert 0 < policy.rollout_metrics["rollout/logprob_gap_mean"] <= gap < 0.05
    weights = policy.rollout_importance_weights(actions, old.logprobs)
    assert weights is not None and weights.shape == old.logprobs.shape
    assert torch.all(weights <= 2.0) and (weights[old.completion_mask] != 1).any()


def test_the_trainer_runs_the_old_pass_when_the_sampler_precision_differs(tiny_lm_dir):
    """With the sampler in bf16 and the scorer in fp32, a μ = 1 step scores π_old in a no-grad
    pass (it is not the gradient pass's detached value) and logs the gap."""
    policy = policy_with(tiny_lm_dir("llama"), "fp32", "lean", sampler="bf16-mixed")
    passes = []
    score = policy.get_token_log_probabilities
    policy.get_token_log_probabilities = lambda s, a: (
        passes.append(torch.is_grad_enabled()) or score(s, a)
    )
    config = GRPOConfig(group_size=4, batch_size=8, ref_update_frequency=0, kl_coeff=0.0)
    trainer = GRPOTrainer(
        policy, REWARD, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.1), config=config
    )
    trainer.train_step(PROMPTS[:2])
    assert passes[0] is False and True in passes
    assert policy.rollout_metrics["rollout/logprob_gap_mean"] > 0


def _share_changed(path, dtype, precision):
    """Share of the weights with a nonzero gradient that one AdamW step at lr 1e-6 changes,
    and the estimated share that cannot change."""
    policy = policy_with(path, precision, dtype=dtype)
    actions = sampled(policy)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-6, weight_decay=0.0)
    before = [p.detach().clone() for p in policy.model.parameters()]
    out = policy.get_token_log_probabilities([None] * len(actions), actions)
    (out.logprobs * out.completion_mask).sum().backward()
    optimizer.step()
    touched = changed = 0
    for p, b in zip(policy.model.parameters(), before, strict=True):
        moved = p.grad != 0
        touched += int(moved.sum())
        changed += int(((p.detach() != b) & moved).sum())
    stalled, _ = update_stall_share(before, 1e-6)
    return changed / touched, stalled


def test_at_lr_1e6_pure_bf16_weights_barely_move_while_bf16_mixed_moves_them_all(tiny_lm_dir):
    """One AdamW step at lr 1e-6: bf16-mixed changes every fp32 master weight with a gradient;
    weights stored in bfloat16 change in under 5 % of places, as the stall estimate predicts."""
    path = tiny_lm_dir("llama")
    mixed, _ = _share_changed(path, None, "bf16-mixed")
    pure, stalled = _share_changed(path, torch.bfloat16, "fp32")
    assert mixed == 1.0
    assert pure < 0.05 and stalled > 0.95


def test_bf16_weights_at_a_small_lr_warn_once_and_bf16_mixed_does_not(tiny_lm_dir, recwarn):
    """A trainer over bf16 weights at lr 1e-6 warns naming policy.precision; over fp32 weights
    with bf16-mixed it does not."""
    config = GRPOConfig(group_size=4, batch_size=8, ref_update_frequency=0, kl_coeff=0.0)
    policy = policy_with(tiny_lm_dir("llama"), dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="policy.precision: bf16-mixed"):
        GRPOTrainer(
            policy, REWARD, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-6), config=config
        )
    recwarn.clear()
    policy = policy_with(tiny_lm_dir("llama"), "bf16-mixed")
    GRPOTrainer(policy, REWARD, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-6), config=config)
    assert not [w for w in recwarn if "rounds away" in str(w.message)]


@pytest.mark.parametrize("speedup, chosen", [(2.3, "bf16-mixed"), (0.14, "fp32")])
def test_auto_is_resolved_when_the_policy_is_built_for_scorer_and_sampler(
    tiny_lm_dir, monkeypatch, speedup, chosen
):
    """policy.precision auto becomes the device's choice in the settings (the object a run's
    config.yaml is written from) and in the lean sampler; rollout.precision auto likewise."""
    monkeypatch.setattr(grpo.precision, "bfloat16_speedup", lambda: speedup)
    policy = policy_with(tiny_lm_dir("llama"), "auto", "lean")
    assert policy.settings.precision == chosen
    assert policy.rollout_engine.precision == chosen
    policy = policy_with(tiny_lm_dir("llama"), "fp32", "lean", sampler="auto")
    assert (policy.settings.precision, policy.rollout_engine.precision) == ("fp32", chosen)


def _trainer(path, precision="bf16-mixed"):
    torch.manual_seed(0)
    policy = policy_with(path, precision, "lean")
    config = GRPOConfig(group_size=4, batch_size=8, ref_update_frequency=0, kl_coeff=0.0)
    return GRPOTrainer(
        policy, REWARD, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), config=config
    )


def test_bf16_mixed_resume_is_bitwise_identical(tiny_lm_dir, tmp_path):
    """2 bf16-mixed steps straight == 1 step, checkpoint (with the policy's sampling state, as
    the run loop keeps it), a fresh trainer and 1 more step: bitwise the same weights."""
    path = tiny_lm_dir("llama")
    straight = _trainer(path)
    for _ in range(2):
        straight.train_step(PROMPTS[:2])
    first = _trainer(path)
    first.train_step(PROMPTS[:2])
    first.save_checkpoint(str(tmp_path / "ck.pt"))
    torch.manual_seed(7)
    resumed = _trainer(path)
    resumed.load_checkpoint(str(tmp_path / "ck.pt"))
    resumed.policy.load_sampling_state(first.policy.sampling_state())
    resumed.train_step(PROMPTS[:2])
    pairs = zip(straight.policy.model.parameters(), resumed.policy.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_the_lean_bf16_sampler_follows_the_models_weights_each_rollout(tiny_lm_dir):
    """The lean engine's bfloat16 copy holds the model's matrices rounded to bfloat16 and its
    vectors in float32, and a weight changed after one rollout is in the copy at the next."""
    policy = policy_with(tiny_lm_dir("llama"), "fp32", "lean", sampler="bf16-mixed")
    sampled(policy)
    low = policy.rollout_engine.low
    for mine, theirs in low.pairs:
        want = theirs.to(torch.bfloat16) if theirs.dim() >= 2 else theirs
        assert mine.dtype == want.dtype and torch.equal(mine, want)
    with torch.no_grad():
        low.pairs[0][1].add_(1.0)
    sampled(policy)
    assert torch.equal(low.pairs[0][0], low.pairs[0][1].to(low.pairs[0][0].dtype))


def test_the_lean_bf16_copy_of_a_lora_model_merges_its_current_adapters(tiny_lm_dir):
    """The copy of a LoRA model is the plain model: each adapted weight is (W + scale B A) in
    bfloat16, recomputed from the adapters at every rollout; the copy's logits pass the
    engine's check against the LoRA model's own forward."""
    from grpo.lm.engines.low_precision import LowPrecisionCopy
    from grpo.lm.loading import LoraSettings, apply_lora

    model, _ = load_tiny_causal_lm(tiny_lm_dir("llama"))
    model = apply_lora(model, LoraSettings(r=4, alpha=8)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    low = LowPrecisionCopy(model, torch.bfloat16)
    low.refresh()
    assert not any("lora" in name for name, _ in low.model.named_parameters())
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    mine = low.model.model.layers[0].self_attn.q_proj.weight
    delta = 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight  # alpha / r
    assert mine.dtype == torch.bfloat16 and delta.abs().max() > 0.1
    assert torch.equal(mine, (layer.base_layer.weight + delta).to(torch.bfloat16))
    with torch.no_grad():
        layer.lora_B["default"].weight.add_(1.0)  # the trainer's next update
    low.refresh()
    delta = 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert torch.equal(mine, (layer.base_layer.weight + delta).to(torch.bfloat16))
    assert len(low.merged) == 7 * len(model.get_base_model().model.layers)  # all-linear


def test_a_lora_policy_samples_through_the_merged_copy(tiny_lm_dir):
    """The lean engine under bf16-mixed samples a LoRA policy through the merged copy, which
    passes the self-check against the LoRA model (logits within bfloat16 rounding)."""
    from grpo.lm.loading import LoraSettings, apply_lora

    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    model = apply_lora(model, LoraSettings(r=4, alpha=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the logits
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=6, temperature=1.0, seed=3))
    policy = CausalLMPolicy(
        model, tokenizer, settings, RolloutSettings("lean", precision="bf16-mixed")
    )
    assert len(sampled(policy)) == 8
    engine = policy.rollout_engine
    assert engine.low.merged and engine.check_gap is not None and engine.check_gap < 5e-2


def test_the_merged_copy_keeps_adapters_on_embedding_and_tied_output_layer_apart(tiny_lm_dir):
    """Adapters on the embedding and on the output layer of a model that ties the two: the copy
    unties them, merges each side's own adapter, and its logits match the LoRA model's
    forward before and after the adapters change (the decoder's self-check)."""
    from grpo.lm.engines.lean import LeanDecoder
    from grpo.lm.engines.low_precision import LowPrecisionCopy
    from grpo.lm.loading import LoraSettings, apply_lora

    model, _ = load_tiny_causal_lm(tiny_lm_dir("qwen2"))  # ties lm_head to embed_tokens
    assert model.lm_head.weight is model.model.embed_tokens.weight
    targets = ("q_proj", "embed_tokens", "lm_head")
    model = apply_lora(model, LoraSettings(r=4, alpha=8, target_modules=targets)).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)  # every adapter non-zero (peft starts one side at 0)
    low = LowPrecisionCopy(model, torch.bfloat16)
    assert low.model.lm_head.weight is not low.model.model.embed_tokens.weight
    assert len(low.merged) == 2 + len(model.get_base_model().model.layers)
    decoder = LeanDecoder(low.model, state_dtype=torch.float32)
    for _ in range(2):
        low.refresh()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # as the engine
            assert decoder.check(model, list(range(3, 12))) < 5e-2  # raises past it
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.add_(0.2)  # the next update
