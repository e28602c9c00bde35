"""Tests for grpo.run.evaluation: held-out reward and accuracy, greedy and sampled."""

from __future__ import annotations

import pytest
import torch
from tiny_models import load_tiny_causal_lm

from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
from grpo.lm.sampling import GenerationSettings
from grpo.rewards.combine import TextReward
from grpo.run.evaluation import evaluate

PROMPTS = [
    {"prompt": p, "target": t} for p, t in [("say a", "a"), ("say b", "b"), ("count c", "c")]
]


def has_target(prompts, completions, target, **_):
    return [float(t in c) for c, t in zip(completions, target, strict=True)]


def length(prompts, completions, **_):
    return [float(len(c)) for c in completions]


@pytest.fixture
def policy(tiny_lm_dir):
    model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
    return CausalLMPolicy(model, tokenizer, CausalLMSettings(GenerationSettings(max_new_tokens=6)))


def test_greedy_metrics_equal_a_direct_computation(policy):
    """Greedy reward mean and accuracy equal those computed by hand on greedy completions; repeatable."""
    reward = TextReward([length])
    metrics, samples = evaluate(
        policy,
        PROMPTS,
        reward,
        accuracy=has_target,
        modes=("greedy",),
        batch_size=2,
        num_logged_samples=2,
    )
    groups = policy.generate_actions(PROMPTS, 1, do_sample=False)
    texts = [g[0].text for g in groups]
    assert metrics["eval/greedy/reward_mean"] == pytest.approx(sum(map(len, texts)) / 3)
    expected_acc = sum(p["target"] in t for p, t in zip(PROMPTS, texts, strict=True)) / 3
    assert metrics["eval/greedy/accuracy"] == pytest.approx(expected_acc)
    assert metrics["eval/greedy/length_mean"] == pytest.approx(
        sum(g[0].num_tokens for g in groups) / 3
    )
    assert [s["completion"] for s in samples] == texts[:2] and samples[0]["prompt"] == "say a"
    again, _ = evaluate(policy, PROMPTS, reward, accuracy=has_target, modes=("greedy",))
    assert again == metrics


def test_sampled_mode_draws_k_completions_per_prompt(policy):
    """The sampled mode scores samples_per_prompt completions of every prompt; None accuracy is left out."""
    sizes = []

    def counting(prompts, completions, **_):
        sizes.append(len(completions))
        return [1.0] * len(completions)

    def half_scored(prompts, completions, target, **_):
        return [None if t == "c" else 1.0 for t in target]

    metrics, samples = evaluate(
        policy,
        PROMPTS,
        TextReward(counting),
        accuracy=half_scored,
        modes=("sampled",),
        samples_per_prompt=4,
    )
    assert sum(sizes) == 12 and metrics["eval/sampled/reward_mean"] == 1.0
    assert (
        metrics["eval/sampled/accuracy"] == 1.0
    )  # the 4 unscored "c" samples are not counted as 0
    assert [s["prompt"] for s in samples] == ["say a", "say b", "count c"]


def test_bad_arguments_are_rejected(policy):
    """No prompts, an unknown mode or a zero sample count are errors naming the argument."""
    reward = TextReward(length)
    with pytest.raises(ValueError, match="prompts is empty"):
        evaluate(policy, [], reward)
    with pytest.raises(ValueError, match="modes: got 'beam'"):
        evaluate(policy, PROMPTS, reward, modes=("beam",))
    with pytest.raises(ValueError, match="samples_per_prompt: got 0"):
        evaluate(policy, PROMPTS, reward, samples_per_prompt=0)


def test_breakdown_sees_every_state_and_completion_text(policy):
    """`breakdown` gets the states and greedy texts in order; its metrics land under the mode."""
    seen = []

    def breakdown(states, texts):
        seen.append((list(states), list(texts)))
        return {"chars": float(sum(map(len, texts)))}

    metrics, _ = evaluate(
        policy, PROMPTS, TextReward([length]), modes=("greedy",), breakdown=breakdown
    )
    texts = [g[0].text for g in policy.generate_actions(PROMPTS, 1, do_sample=False)]
    assert seen == [(PROMPTS, texts)]
    assert metrics["eval/greedy/chars"] == float(sum(map(len, texts)))


def test_reference_kl_is_zero_for_the_starting_model_and_a_masked_token_mean(policy):
    """kl_mean: exactly 0 against an unchanged copy; after a change, the mean of the per-token
    estimate over the completion mask, the same for any batch size."""
    import torch

    from grpo.functional.kl import kl_estimate
    from grpo.step.objective import policy_logprobs

    reward = TextReward([length])
    reference = policy.make_reference()
    same, _ = evaluate(policy, PROMPTS, reward, modes=("greedy",), reference=reference)
    assert same["eval/greedy/kl_mean"] == 0.0
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    found = {
        size: evaluate(
            policy, PROMPTS, reward, modes=("greedy",), reference=reference,
            kl_estimator="k1", batch_size=size,
        )[0]["eval/greedy/kl_mean"]
        for size in (1, 3)
    }  # fmt: skip
    actions = [g[0] for g in policy.generate_actions(PROMPTS, 1, do_sample=False)]
    with torch.no_grad():
        current = policy_logprobs(policy, PROMPTS, actions)
        ref_logprobs = policy_logprobs(reference, PROMPTS, actions).logprobs
    mask = current.completion_mask
    expected = kl_estimate(current.logprobs, ref_logprobs, "k1")[mask].double().mean().item()
    assert expected != 0.0 and mask.sum() > 3
    assert found[1] == pytest.approx(expected, rel=1e-5)
    assert found[3] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("seed", [0, None])
def test_evaluation_leaves_the_training_sampling_stream_as_it_was(tiny_lm_dir, seed):
    """Rollouts after an evaluation (greedy and sampled) draw what they draw without it, whether
    sampling is seeded per call (seed 0) or draws from the global RNG (seed None)."""

    def rollouts(evaluate_between: bool) -> list[list[int]]:
        model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("qwen2"))
        generation = GenerationSettings(max_new_tokens=6, seed=seed)
        policy = CausalLMPolicy(model, tokenizer, CausalLMSettings(generation))
        torch.manual_seed(1)
        drawn = [c.completion_ids for c in policy.generate_actions(PROMPTS, 4)[0]]
        if evaluate_between:
            evaluate(policy, PROMPTS, TextReward([length]), samples_per_prompt=3)
        return drawn + [c.completion_ids for c in policy.generate_actions(PROMPTS, 4)[0]]

    plain = rollouts(False)
    assert plain[:4] != plain[4:]  # the two rollouts differ: the second is not a replay
    assert rollouts(True) == plain
