"""Held-out evaluation of a text policy: mean reward and task accuracy, greedy and sampled.

`evaluate` generates completions for held-out prompt records with the policy's
own `generate_actions` (greedy: `do_sample=False`, one completion per prompt;
sampled: the policy's sampling settings, `samples_per_prompt` each), scores
them with a `TextReward`, and optionally with an accuracy function that follows
the reward contract `accuracy(prompts, completions, **columns) -> list[float | bool | None]`
(1/True = correct; None = not scored, left out of the mean).

With a `reference` policy (a frozen copy of the policy as the run started,
`evaluation.reference_kl`), it also scores the evaluated completions under
both and reports the mean per-token KL estimate (the run's `grpo.kl_estimator`,
as `kl/mean` in training) over their tokens. On sampled completions this is an
estimate of KL(π‖π_ref) at the evaluation's sampling settings; on greedy ones
it measures how far the two disagree along the greedy path, not an expectation.

Evaluation leaves training's randomness as it found it: the policy's sampling
state (`sampling_state`, when it has one) and the global torch RNG are restored
afterwards, so a run trains the same with evaluations or without them. The
sampled mode draws from the position the next training rollout then draws from
again, on other prompts.

Returns flat scalar metrics under "eval/<mode>/..." and a few samples (prompt,
completion, reward) for the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo.functional.kl import kl_estimate
from grpo.rewards.combine import TextReward
from grpo.run.loop import check_int, randomness_kept
from grpo.step.objective import policy_logprobs

__all__ = ["MODES", "EvalConfig", "evaluate"]

# generation overrides per evaluation mode (None = the policy's own settings)
MODES: dict[str, dict[str, Any]] = {"greedy": {"do_sample": False}, "sampled": {}}


@dataclass
class EvalConfig:
    """Held-out evaluation: always at the start and the end, and every `every` steps."""

    every: int = 0
    """Evaluate after every this many steps as well; 0 = only at start and end."""
    modes: tuple[str, ...] = ("greedy", "sampled")
    """Greedy decoding and/or the policy's own sampling settings."""
    samples_per_prompt: int = 1
    """Completions per prompt in the sampled mode."""
    batch_size: int = 32
    """Prompts per generation call."""
    num_logged_samples: int = 3
    """(prompt, completion, reward) examples logged per mode at each evaluation."""
    reference_kl: bool = False
    """Also report eval/<mode>/kl_mean, the mean per-token KL estimate (grpo.kl_estimator) of
    the evaluated completions to a frozen copy of the starting policy (single-turn text tasks
    built on text_parts: arithmetic, chess, prompts; the copy costs one more model in memory)."""

    def __post_init__(self) -> None:
        self.modes = tuple(self.modes)
        check_int("evaluation", "every", self.every, minimum=0)
        check_int("evaluation", "samples_per_prompt", self.samples_per_prompt)
        check_int("evaluation", "batch_size", self.batch_size)
        check_int("evaluation", "num_logged_samples", self.num_logged_samples, minimum=0)
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"evaluation.modes: got {mode!r}; allowed: {', '.join(MODES)}")



def evaluate(
    policy: Any,
    prompts: Sequence[Mapping[str, Any]],
    reward: TextReward,
    *,
    accuracy: Callable[..., Sequence[Any]] | None = None,
    modes: Sequence[str] = ("greedy", "sampled"),
    samples_per_prompt: int = 1,
    batch_size: int = 32,
    num_logged_samples: int = 3,
    breakdown: Callable[[list[Mapping[str, Any]], list[str]], Mapping[str, float]] | None = None,
    reference: Any = None,
    kl_estimator: str = "k3",
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics {"eval/<mode>/reward_mean", ...} and up to `num_logged_samples` samples per mode;
    `breakdown(states, completion texts)` adds a task's own metrics under "eval/<mode>/", and a
    `reference` policy "eval/<mode>/kl_mean" (`kl_estimator` per token, see the module)."""
    if not prompts:
        raise ValueError("prompts is empty; evaluation needs at least one held-out prompt")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"modes: got {mode!r}; allowed: {', '.join(MODES)}")
    for name, value in (("samples_per_prompt", samples_per_prompt), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: got {value!r}; allowed: an integer >= 1")
    judge = TextReward({"accuracy": accuracy}, all_none="zero") if accuracy is not None else None
    metrics: dict[str, float] = {}
    samples: list[dict[str, Any]] = []
    for mode in modes:
        k = 1 if mode == "greedy" else samples_per_prompt
        with randomness_kept(policy):
            states, actions = _generate(policy, prompts, k, batch_size, MODES[mode])
        rewards, _ = reward.score(states, actions)  # (n,)
        prefix = f"eval/{mode}"
        metrics[f"{prefix}/reward_mean"] = rewards.double().mean().item()
        metrics.update({f"{prefix}/{key}": v for key, v in reward.last_metrics.items()})
        lengths = [len(getattr(a, "completion_ids", ())) for a in actions]
        metrics[f"{prefix}/length_mean"] = sum(lengths) / len(lengths)
        if judge is not None:
            _, values = judge.score(states, actions)
            scored = [v for v in values["accuracy"] if v is not None]
            metrics[f"{prefix}/accuracy"] = sum(scored) / len(scored) if scored else float("nan")
        if reference is not None:
            metrics[f"{prefix}/kl_mean"] = _kl_mean(
                policy, reference, states, actions, batch_size, kl_estimator
            )
        if breakdown is not None:
            texts = [getattr(a, "text", a) for a in actions]
            metrics.update({f"{prefix}/{k}": v for k, v in breakdown(states, texts).items()})
        for n in range(0, min(num_logged_samples * k, len(actions)), k):
            samples.append(
                {
                    "mode": mode,
                    "prompt": states[n].get("prompt")
                    if isinstance(states[n], Mapping)
                    else states[n],
                    "completion": getattr(actions[n], "text", actions[n]),
                    "reward": float(rewards[n]),
                }
            )
    return metrics, samples


def _generate(
    policy: Any, prompts: Sequence[Mapping[str, Any]], k: int, batch_size: int, overrides: dict
) -> tuple[list[Mapping[str, Any]], list[Any]]:
    """k completions per prompt, in batches of prompts -> flat (states, actions)."""
    states: list[Mapping[str, Any]] = []
    actions: list[Any] = []
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        groups = policy.generate_actions(batch, k, **overrides)
        for state, group in zip(batch, groups, strict=True):
            states.extend([state] * len(group))
            actions.extend(group)
    return states, actions


def _kl_mean(
    policy: Any, reference: Any, states: list, actions: list, batch_size: int, estimator: str
) -> float:
    """Mean of the per-token KL estimate over every counted completion token."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(actions), batch_size):
            part = slice(start, start + batch_size)
            current = policy_logprobs(policy, states[part], actions[part])  # (n, T)
            ref_logprobs = policy_logprobs(reference, states[part], actions[part]).logprobs
            kl = kl_estimate(current.logprobs, ref_logprobs.to(current.logprobs.device), estimator)
            total += kl[current.completion_mask].double().sum().item()
            tokens += int(current.completion_mask.sum())
    return total / tokens if tokens else 0.0
