"""grpo.lm.engines.vllm_cpu.probe_problems: the probe that checks a reloaded engine, direction
included, on hand-made log-probs and on a tiny model whose engine copy missed a reload."""

import copy

import torch
from tiny_models import load_tiny_causal_lm

from grpo.lm.engines.vllm_cpu import (
    PROBE_MIN_MOVE,
    probe_ids,
    probe_problems,
    trainer_probe_logprobs,
)

TOLERANCE = 1e-2  # vLLM's fp32 default


def test_an_engine_nearer_the_previous_weights_fails_even_within_tolerance():
    """The trainer moved the probe by 5e-3 (< tolerance): an engine at the old log-probs fails on
    direction alone; one at the new log-probs passes; a move under 1e-3 is not judged."""
    previous = torch.linspace(-6.0, -1.0, 31)
    trainer = previous + 5e-3
    stale, fresh = previous + 1e-5, trainer - 1e-5
    assert probe_problems(stale, trainer, None, TOLERANCE) == []  # the tolerance alone passes it
    (problem,) = probe_problems(stale, trainer, previous, TOLERANCE)
    assert "did not take" in problem
    assert probe_problems(fresh, trainer, previous, TOLERANCE) == []
    barely = previous + 0.5 * PROBE_MIN_MOVE
    assert probe_problems(previous, barely, previous, TOLERANCE) == []


def test_out_of_tolerance_is_named_with_the_setting():
    """A gap above the tolerance names its size and vllm.probe_tolerance."""
    trainer = torch.zeros(8)
    (problem,) = probe_problems(trainer + 0.5, trainer, None, TOLERANCE)
    assert "0.5" in problem and "vllm.probe_tolerance" in problem


def small_step(model, probe, low=2e-3):
    """One SGD step on -log p(probe) at the smallest learning rate (doubling from 1e-9) that
    moves the probe's log-probs by more than `low` somewhere; returns that move (< 2.5 low or
    so: the move roughly doubles with the rate)."""
    before = trainer_probe_logprobs(model, probe)
    model.zero_grad()
    logits = model(input_ids=torch.tensor([probe])).logits[0, :-1].float()  # (n-1, V)
    (-torch.log_softmax(logits, -1)[torch.arange(len(probe) - 1), probe[1:]].sum()).backward()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    lr = 1e-9
    while True:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.grad is not None:
                    p.copy_(start[name] - lr * p.grad)
        moved = float((trainer_probe_logprobs(model, probe) - before).abs().max())
        if moved > low:
            model.zero_grad()
            return moved
        lr *= 2


def test_a_skipped_reload_at_a_small_learning_rate_is_caught(tiny_lm_dir):
    """A tiny model stepped at a learning rate that moves its probe by 2e-3 nats; a copy that
    missed the reload (the old weights) passes the tolerance but fails the direction check,
    and the reloaded copy passes."""
    model, _ = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    probe = probe_ids(model.config.vocab_size, model.config.max_position_embeddings)
    stale = copy.deepcopy(model)  # the engine that never got the new weights
    before = trainer_probe_logprobs(model, probe)
    assert small_step(model, probe) < TOLERANCE  # within the tolerance
    trainer = trainer_probe_logprobs(model, probe)
    engine = trainer_probe_logprobs(stale, probe)
    assert float((engine - trainer).abs().max()) < TOLERANCE
    assert probe_problems(engine, trainer, before, TOLERANCE) != []
    reloaded = trainer_probe_logprobs(copy.deepcopy(model), probe)
    assert probe_problems(reloaded, trainer, before, TOLERANCE) == []
