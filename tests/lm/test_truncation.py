"""Top-k / top-p sampling with the trainer's own model (grpo.lm.policy, grpo.lm.engines).

The engines sample from the truncated distribution q = p / Z (p the tempered
softmax, Z the mass of the kept tokens); the loss scores p. The engines report
log q of each sampled token, and the loss weighs each token by p / q = Z.
The reference for q is independent: a plain forward over prompt + completion,
tempered, filtered with the same rule as transformers' warpers, renormalised.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.config import GRPOConfig
from grpo.functional.sampling import filter_logits
from grpo.lm.engines import RolloutSettings
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.rewards.combine import TextReward
from grpo.step.trainer import GRPOTrainer

PROMPTS = [{"prompt": "say a"}, {"prompt": "count b c"}, {"prompt": "one two"}]
TEMPERATURE = 0.8


def make_policy(path, engine: str, **generation) -> CausalLMPolicy:
    model, tokenizer = load_tiny_causal_lm(path)
    settings = GenerationSettings(max_new_tokens=6, temperature=TEMPERATURE, seed=5, **generation)
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(settings), RolloutSettings(engine))


def reference_logq(policy: CausalLMPolicy, completion, top_k: int, top_p: float) -> torch.Tensor:
    """log q of each completion token from one unpadded forward -> (t,)."""
    ids = torch.tensor([list(completion.prompt_ids) + list(completion.completion_ids)])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0].double() / TEMPERATURE  # (P + t, V)
    P, tokens = len(completion.prompt_ids), torch.tensor(completion.completion_ids)
    scoring = logits[P - 1 : -1]  # (t, V) position P - 1 + i scores token i
    kept = filter_logits(scoring, top_k, top_p).log_softmax(-1)
    return kept.gather(-1, tokens[:, None]).squeeze(-1)  # (t,)


@pytest.mark.parametrize("engine", ["transformers", "lean"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.7), (3, 1.0), (4, 0.8)])
def test_engines_report_log_q_of_every_sampled_token(tiny_lm_dir, engine, top_k, top_p):
    """Sampled completions carry log q of each token, equal to the reference to 1e-5."""
    policy = make_policy(tiny_lm_dir("llama"), engine, top_k=top_k, top_p=top_p)
    completions = [c for group in policy.generate_actions(PROMPTS, 4) for c in group]
    assert not policy.sampler_is_scorer
    for completion in completions:
        want = reference_logq(policy, completion, top_k, top_p)
        got = torch.tensor(completion.engine_logprobs, dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_loss_weights_are_the_kept_mass(tiny_lm_dir):
    """The loss weight of each token is p / q = Z, the tempered mass of the kept set (<= 1)."""
    policy = make_policy(tiny_lm_dir("llama"), "lean", top_p=0.7)
    actions = [c for group in policy.generate_actions(PROMPTS, 4) for c in group]
    with torch.no_grad():
        old = policy.get_token_log_probabilities(PROMPTS * 4, actions)
    weights = policy.rollout_importance_weights(actions, old.logprobs)  # (N, T)
    for n, completion in enumerate(actions):
        ids = torch.tensor([list(completion.prompt_ids) + list(completion.completion_ids)])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].double() / TEMPERATURE
        P, t = len(completion.prompt_ids), completion.num_tokens
        probs = logits[P - 1 : -1].softmax(-1)  # (t, V)
        kept = filter_logits(logits[P - 1 : -1], 0, 0.7) > float("-inf")
        mass = (probs * kept).sum(-1)  # (t,) Z at each position
        torch.testing.assert_close(weights[n, :t].double(), mass.clamp(max=1.0), rtol=0, atol=1e-5)
    assert (weights[old.completion_mask] < 0.999).any()  # truncation did cut some mass


def test_without_truncation_nothing_changes(tiny_lm_dir):
    """top_p 1 and top_k 0: no sampler log-probs, the sampler is the scorer, no weights."""
    policy = make_policy(tiny_lm_dir("llama"), "lean")
    actions = [c for group in policy.generate_actions(PROMPTS, 2) for c in group]
    assert policy.sampler_is_scorer and all(c.engine_logprobs is None for c in actions)
    old = torch.zeros(len(actions), 6)
    assert policy.rollout_importance_weights(actions, old) is None


@pytest.mark.parametrize("skip_old_pass", [True, False])
def test_a_truncated_grpo_step_records_pi_old_and_weighs_the_loss(tiny_lm_dir, skip_old_pass):
    """With top_p < 1 the sampler is not the scorer: the policy term is weighted
    (importance_weight/mean in (0, 1)) and the gap reported, whether log π_old comes from
    the no-grad pass or, one update per rollout, from the gradient pass detached."""
    policy = make_policy(tiny_lm_dir("qwen2"), "transformers", top_p=0.6)
    calls = []
    score = policy.get_token_log_probabilities
    policy.get_token_log_probabilities = lambda s, a: calls.append(torch.is_grad_enabled()) or score(s, a)
    config = GRPOConfig(group_size=4, batch_size=12, num_epochs_per_update=1, kl_coeff=0.0,
                        entropy_coeff=0.0, skip_zero_advantage=False,
                        skip_redundant_old_logprobs=skip_old_pass)  # fmt: skip
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    metrics = GRPOTrainer(policy, reward, None, config).train_step(PROMPTS)
    assert calls == ([True] if skip_old_pass else [False, True])  # no-grad pass, then gradient
    assert 0.0 < metrics["importance_weight/mean"] < 1.0
    assert policy.rollout_metrics["rollout/logprob_gap_mean"] > 0  # log p - log q = log Z
