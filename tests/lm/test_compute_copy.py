"""bf16-copy: forward and backward on a bfloat16 copy, gradients and updates on float32 masters."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings
from grpo.lm.engines.transformers import sample_token_ids
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.lm.scoring import score_completions
from grpo.masked_fill.policy import MaskedFillConfig
from grpo.step.trainer import GRPOTrainer
from tests.lm.test_mixed_precision import PROMPTS, REWARD, _share_changed, policy_with, sampled

REPO = Path(__file__).resolve().parents[2]
STATES = [s for s in PROMPTS[:2] for _ in range(4)]


def _loss(out):
    return (out.logprobs * out.completion_mask).sum()


def _bf16_model(model):
    """The model with every floating parameter cast to bfloat16 and its buffers as they were:
    what the copy should be, built independently."""
    plain = copy.deepcopy(model)
    for p in plain.parameters():
        p.data = p.data.to(torch.bfloat16)
    return plain


def test_gradients_land_on_the_float32_masters_exactly_and_accumulate_in_float32(tiny_lm_dir):
    """Two backward passes under bf16-copy: each master's .grad is float32 and equals, bit for
    bit, the float32 sum of the two bfloat16 gradients an independently cast bfloat16 model
    gets from the same two passes; the copy keeps no gradient of its own."""
    policy = policy_with(tiny_lm_dir("llama"), "bf16-copy")
    actions = sampled(policy)
    halves = (actions[:4], actions[4:])
    plain = _bf16_model(policy.model)
    settings = policy.scoring_settings()._replace(precision="fp32")
    want = {}
    for part in halves:
        plain.zero_grad()
        _loss(score_completions(plain, part, settings)[0]).backward()
        for name, p in plain.named_parameters():
            g = p.grad.float()
            want[name] = g if name not in want else want[name] + g
    for part in halves:
        _loss(policy.get_token_log_probabilities(STATES[:4], part)).backward()
    for name, master in policy.model.named_parameters():
        assert master.grad.dtype == torch.float32 and torch.equal(master.grad, want[name]), name
    assert all(p.grad is None for p in policy.compute_copy.model.parameters())
    assert any(want[name].abs().max() > 0 for name in want)


def test_the_copy_is_the_masters_rounded_and_is_recast_only_after_they_change(tiny_lm_dir):
    """Every copy parameter is its master rounded to bfloat16 (the tied output layer stays
    tied); after an optimizer step the next forward reads the new weights rounded, and with
    no change in between the copy is not cast again."""
    policy = policy_with(tiny_lm_dir("qwen2"), "bf16-copy")  # qwen2: tied output layer
    copied = policy.compute_copy
    body = copied.model.get_output_embeddings().weight
    assert body is copied.model.get_input_embeddings().weight
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    actions = sampled(policy)
    _loss(policy.get_token_log_probabilities(STATES, actions)).backward()
    optimizer.step()
    casts = []
    refresh = copied.refresh
    copied.refresh = lambda: casts.append(1) or refresh()
    net = policy.compute_model()
    net2 = policy.compute_model()
    assert net is net2 is copied.model and casts == [1]
    for mine, master in copied.pairs:
        assert mine.dtype == torch.bfloat16 and torch.equal(mine, master.to(torch.bfloat16))


def test_bf16_copy_is_within_bfloat16_rounding_of_fp32_and_of_bf16_mixed(tiny_lm_dir):
    """bf16-copy's float32 log-probs are within 0.05 of fp32's and its gradients within 5 %
    (relative norm) of fp32's and bf16-mixed's, so the optimizer's update matches autocast's
    within bfloat16 rounding; and it differs from both (it is not silently float32)."""
    path = tiny_lm_dir("llama")
    actions = sampled(policy_with(path))
    got = {}
    for precision in ("fp32", "bf16-mixed", "bf16-copy"):
        policy = policy_with(path, precision)
        out = policy.get_token_log_probabilities(STATES, actions)
        _loss(out).backward()
        grads = torch.cat([p.grad.flatten() for p in policy.model.parameters()])
        got[precision] = out.logprobs.detach(), grads
    (lp32, g32), (_, gmix), (lpc, gc) = got["fp32"], got["bf16-mixed"], got["bf16-copy"]
    assert lpc.dtype == torch.float32 and gc.dtype == torch.float32
    assert 0 < (lpc - lp32).abs().max() < 0.05
    assert 0 < (gc - g32).norm() / g32.norm() < 0.05
    assert 0 < (gc - gmix).norm() / gmix.norm() < 0.05


def test_an_update_below_bfloat16_spacing_still_moves_every_master(tiny_lm_dir):
    """One AdamW step at lr 1e-6 under bf16-copy changes every float32 master weight that got
    a gradient (a bfloat16-stored weight would round most such steps away)."""
    share, _ = _share_changed(tiny_lm_dir("llama"), None, "bf16-copy")
    assert share == 1.0


def test_the_transformers_engine_samples_from_the_scorers_copy(tiny_lm_dir):
    """Under bf16-copy the transformers engine samples from the copy the loss scores with:
    sampler_is_scorer holds, no sampler log-probs are carried, and the log-probs generate
    gives each sampled token equal the scorer's to cached-decoding rounding (< 0.02)."""
    policy = policy_with(tiny_lm_dir("llama"), "bf16-copy")
    assert policy.rollout_engine.model is policy.compute_copy.model
    assert policy.sampler_is_scorer
    actions = sampled(policy)
    assert all(a.engine_logprobs is None for a in actions)
    rows = [a.prompt_ids for a in actions]
    settings = GenerationSettings(max_new_tokens=6, temperature=1.0, seed=11)
    with torch.no_grad():
        samples = sample_token_ids(
            policy.compute_model(), policy.tokenizer, rows, settings, policy.eos_token_ids, 11,
            logprobs=True,
        )  # fmt: skip
        redone = [policy._completion(p, ids, settings, lps) for p, ids, lps in
                  zip(rows, samples.token_ids, samples.logprobs, strict=True)]  # fmt: skip
        scored = policy.get_token_log_probabilities(STATES, redone)
    for n, action in enumerate(redone):
        k = action.num_tokens
        gap = (torch.tensor(action.engine_logprobs) - scored.logprobs[n, :k]).abs().max()
        assert gap < 0.02, (n, gap)


def test_two_steps_straight_equal_one_step_checkpoint_resume_one_step(tiny_lm_dir, tmp_path):
    """bf16-copy through the trainer: 2 AdamW steps straight == 1 step, checkpoint, a fresh
    trainer (its copy cast from the loaded weights) and 1 more step, bit for bit; the steps
    moved the weights."""
    path = tiny_lm_dir("llama")
    config = GRPOConfig(group_size=4, batch_size=8, ref_update_frequency=0, kl_coeff=0.0)

    def trainer():
        torch.manual_seed(0)
        policy = policy_with(path, "bf16-copy")
        optimizer = lambda ps: torch.optim.AdamW(ps, lr=1e-3)  # noqa: E731
        return GRPOTrainer(policy, REWARD, optimizer=optimizer, config=config)

    start = [p.detach().clone() for p in trainer().policy.model.parameters()]
    straight = trainer()
    for _ in range(2):
        straight.train_step(PROMPTS[:2])
    first = trainer()
    first.train_step(PROMPTS[:2])
    first.save_checkpoint(str(tmp_path / "ck.pt"))
    resumed = trainer()
    resumed.load_checkpoint(str(tmp_path / "ck.pt"))
    resumed.policy.load_sampling_state(first.policy.sampling_state())
    resumed.train_step(PROMPTS[:2])
    pairs = list(zip(straight.policy.model.parameters(), resumed.policy.model.parameters(),
                     strict=True))  # fmt: skip
    assert all(torch.equal(a, b) for a, b in pairs)
    assert any(not torch.equal(a, s) for (a, _), s in zip(pairs, start, strict=True))


def test_a_lora_policys_adapter_gradients_land_on_its_float32_adapters(tiny_lm_dir):
    """A LoRA policy under bf16-copy: its copy is a LoRA model in bfloat16; after a backward
    every trainable float32 adapter has a float32 gradient (nonzero somewhere), the frozen
    base weights none; the reference (adapters off) scores with the copy, without grad."""
    from grpo.lm.loading import LoraSettings, apply_lora

    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))
    model = apply_lora(model, LoraSettings(r=4, alpha=8))
    settings = CausalLMSettings(
        GenerationSettings(max_new_tokens=6, temperature=1.0, seed=3), precision="bf16-copy"
    )
    policy = CausalLMPolicy(model, tokenizer, settings, RolloutSettings("transformers"))
    actions = sampled(policy)
    _loss(policy.get_token_log_probabilities(STATES, actions)).backward()
    grads = {name: p.grad for name, p in policy.model.named_parameters()}
    trained = [name for name, p in policy.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name in trained)
    assert all(grads[name].dtype == torch.float32 for name in trained)
    assert any(grads[name].abs().max() > 0 for name in trained)
    assert all(grads[name] is None for name in grads if name not in trained)
    reference = policy.make_reference()
    out = reference.get_token_log_probabilities(STATES, actions)
    assert out.logprobs.dtype == torch.float32 and not out.logprobs.requires_grad


def test_bf16_copy_is_refused_where_it_cannot_run():
    """The fill-in policy has no copy: its config refuses bf16-copy naming the field; a run
    with a sampling thread (run.max_staleness) is refused before anything loads."""
    from grpo.run.config_files import load_config
    from grpo.run.structured import ConfigError
    from grpo.run.train import build_loop

    with pytest.raises(ValueError, match="MaskedFillConfig.precision: got 'bf16-copy'"):
        MaskedFillConfig(mask_token_id=1, precision="bf16-copy")
    config = load_config(
        str(REPO / "configs" / "demo.yaml"), ["run.max_staleness=1", "policy.precision=bf16-copy"]
    )
    with pytest.raises(ConfigError, match="policy.precision: bf16-copy with run.max_staleness=1"):
        build_loop(config, lambda config: pytest.fail("the parts were built"))


def test_the_lean_engine_samples_under_bf16_copy_as_under_bf16_mixed(tiny_lm_dir):
    """The lean engine holds the float32 model and samples from its own bfloat16 copy: under
    bf16-copy it draws, bit for bit, the tokens it draws under bf16-mixed from the same weights
    and seed, and counts as the scorer as it does there."""
    path = tiny_lm_dir("llama")
    drawn = {}
    for precision in ("bf16-mixed", "bf16-copy"):
        policy = policy_with(path, precision, "lean")
        assert policy.sampler_is_scorer
        drawn[precision] = [a.completion_ids for a in sampled(policy)]
    assert drawn["bf16-copy"] == drawn["bf16-mixed"]
    assert any(len(ids) > 1 for ids in drawn["bf16-copy"])
