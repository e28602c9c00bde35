"""The vLLM parts of `gpu_check.py`: what only a CUDA GPU with vLLM can show.

Each part builds the policy it needs on a random-init model of SmolLM2-135M's
shape (vocabulary a multiple of 64, head size 64: vLLM's transformers backend
can share it) and closes it at the end; every number is measured, every claim
checked, and a part that finds a claim false reports "failed" with why.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable

import torch

GIB = 2**30
PROMPTS = [{"prompt": "say a b"}, {"prompt": "count c d e"}, {"prompt": "write red"}]


def _model(dtype: torch.dtype):
    from gpu_check import smollm2_shape

    return smollm2_shape(dtype)


def _policy(model, tokenizer, **vllm):
    from grpo.lm.engines import RolloutSettings, VLLMSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    settings = CausalLMSettings(GenerationSettings(max_new_tokens=16, seed=0))
    vllm_settings = VLLMSettings(gpu_memory_utilization=0.2, max_model_len=256, **vllm)
    return CausalLMPolicy(model, tokenizer, settings, RolloutSettings("vllm", vllm_settings))


def _step(policy, lr: float = 1e-3) -> dict:
    from grpo.config import GRPOConfig
    from grpo.rewards.combine import TextReward
    from grpo.step.trainer import GRPOTrainer

    reward = TextReward(lambda prompts, completions, **_: [len(c) / 10 for c in completions])
    config = GRPOConfig(group_size=4, batch_size=12, kl_coeff=0.0, learning_rate=lr)
    return GRPOTrainer(policy, reward, None, config).train_step(PROMPTS)


def _gap(policy, groups) -> tuple[float, float]:
    """Mean and max |trainer - vLLM| log-prob of already sampled groups, scored now."""
    actions = [a for g in groups for a in g]
    states = [s for s, g in zip(PROMPTS, groups, strict=True) for _ in g]
    with torch.no_grad():
        policy.get_token_log_probabilities(states, actions)
    m = policy.rollout_metrics
    return m["rollout/logprob_gap_mean"], m["rollout/logprob_gap_max"]


def _bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _require(condition: bool, claim: str) -> None:
    if not condition:
        raise AssertionError(f"claim false: {claim}")


def shared_engine() -> dict:
    """Forward after the build, sharing + storage check, memory held, a step seen, the gap."""
    model, tokenizer = _model(torch.bfloat16)
    ids = torch.tensor([[1, 2, 3, 4]], device="cuda")
    with torch.no_grad():
        want = model(input_ids=ids).logits
    free = _free()
    with _policy(model, tokenizer) as policy:
        held = {"shared": (free - _free()) / GIB}
        engine = policy.rollout_engine
        with torch.no_grad():
            same_forward = torch.equal(model(input_ids=ids).logits, want)
            reference = copy.deepcopy(model)(input_ids=ids).logits  # what make_reference does
        _require(same_forward and torch.equal(reference, want), "trainer forward unchanged")
        _require(engine.shared and not engine.sleeps, "shared, without sleep mode")
        engine.check()  # storage: every vLLM parameter is the trainer's tensor
        fresh = policy.generate_actions(PROMPTS, 4)
        fresh_gap = _gap(policy, fresh)
        _step(policy, lr=1e-2)
        engine.check()  # still the same storage after the optimizer step: no copy
        stale_gap = _gap(policy, fresh)
        new_gap = _gap(policy, policy.generate_actions(PROMPTS, 4))
        _require(stale_gap[0] > 5 * max(fresh_gap[0], new_gap[0]), "vLLM sampled the update")
    # the same engine holding a copy: the difference is one copy of the weights if sharing
    # left none behind (the KV cache is sized alike: vLLM had dummy weights at both builds)
    copying = {"weight_sync": "load_weights", "sleep_between_rollouts": False}
    free = _free()
    with _policy(model, tokenizer, **copying):
        held["copy"] = (free - _free()) / GIB
    weights = _bytes(model) / GIB
    extra = held["copy"] - held["shared"]
    _require(extra > 0.8 * weights, "a shared engine holds no copy of the weights")
    return {
        "status": "ok",
        "summary": f"held {held['shared']:.2f} GiB shared, {held['copy']:.2f} copying "
        f"(weights {weights:.2f}); bf16 gap mean {fresh_gap[0]:.3g} max {fresh_gap[1]:.3g}",
        "held_shared_gib": held["shared"], "held_copy_gib": held["copy"], "weights_gib": weights,
        "bf16_gap_mean": fresh_gap[0], "bf16_gap_max": fresh_gap[1],
        "gap_after_step_stale": stale_gap[0], "gap_after_step_fresh": new_gap[0],
    }  # fmt: skip


def _free() -> int:
    """Free device memory in bytes, once the GPU is idle and torch's cache is returned (a
    pool of vLLM's is not: what it holds counts as taken)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


class _VLLMLog(logging.Handler):
    """vLLM's log lines, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def copied_engine_sleep() -> dict:
    """A float32 trainer with a bfloat16 vLLM: one sleep/wake, what it frees and backs up."""
    model, tokenizer = _model(torch.float32)
    log, vllm_logger = _VLLMLog(), logging.getLogger("vllm")
    vllm_logger.addHandler(log)
    try:
        with _policy(model, tokenizer, dtype="bfloat16") as policy:
            engine = policy.rollout_engine
            _require(engine.sleeps and not engine.shared, "a copy, with sleep mode")
            asleep = torch.cuda.mem_get_info()[0]
            start = time.perf_counter()
            engine._wake()
            wake_s = time.perf_counter() - start
            awake = torch.cuda.mem_get_info()[0]
            engine.sync()  # level 2 discarded the copy: the sync writes it again
            engine._sleep()
            groups = policy.generate_actions(PROMPTS, 2)  # wake, sync, sample, sleep
            gap = _gap(policy, groups)
    finally:
        vllm_logger.removeHandler(log)
    freed = [_gib(line, r"sleep freed ([\d.]+) GiB") for line in log.lines]
    backed = [_gib(line, r"of which ([\d.]+) GiB is backed up") for line in log.lines]
    freed, backed = [f for f in freed if f is not None], [b for b in backed if b is not None]
    _require(bool(backed), "vLLM logged what sleep freed and backed up")
    _require(max(backed) < 0.5 * _bytes(model) / 2 / GIB, "no weights backed up (level 2)")
    return {
        "status": "ok",
        "summary": f"sleep frees {(asleep - awake) / GIB:.2f} GiB; vLLM: freed {freed[-1]:.2f}, "
        f"backed up {backed[-1]:.3f} GiB; wake {wake_s:.2f} s",
        "freed_by_sleep_gib": (asleep - awake) / GIB, "vllm_freed_gib": freed[-1],
        "vllm_backed_up_gib": backed[-1], "wake_s": wake_s, "copy_gap_mean": gap[0],
    }  # fmt: skip


def _gib(line: str, pattern: str) -> float | None:
    found = re.search(pattern, line)
    return float(found.group(1)) if found else None


def lora_merged_copy() -> dict:
    """A LoRA policy: W + BA copied into vLLM, checked, and followed after an update."""
    from grpo.lm.loading import LoraSettings, apply_lora

    model, tokenizer = _model(torch.bfloat16)
    with _policy(apply_lora(model, LoraSettings(r=8)), tokenizer) as policy:
        _require(not policy.rollout_engine.shared, "LoRA is copied")
        _step(policy, lr=1e-2)
        gap = _gap(policy, policy.generate_actions(PROMPTS, 2))
        _require(gap[0] < 0.05, "vLLM samples with the updated W + BA")
    return {"status": "ok", "summary": f"gap mean {gap[0]:.3g}", "lora_gap_mean": gap[0]}


def close_and_build_again() -> dict:
    """Two engines one after the other in one process (vLLM's memory pool is per process)."""
    model, tokenizer = _model(torch.float32)
    for _ in range(2):
        with _policy(model, tokenizer, dtype="bfloat16") as policy:  # copy: sleep mode's pool
            policy.generate_actions(PROMPTS, 2)
    free = torch.cuda.mem_get_info()[0] / GIB
    return {"status": "ok", "summary": f"{free:.1f} GiB free after", "free_after_gib": free}


VLLM_PARTS: dict[str, Callable[[], dict]] = {
    "vllm/shared-engine": shared_engine,
    "vllm/copy-sleep-wake": copied_engine_sleep,
    "vllm/lora-merged-copy": lora_merged_copy,
    "vllm/close-and-build-again": close_and_build_again,
}
"""part name -> () -> record; run by gpu_check.py when CUDA and vLLM are present."""
