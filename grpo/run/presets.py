"""Presets: the values that define each algorithm family, as config overrides.

A preset is a partial config; a config file's own keys (and `--set`) override
it. `grpo presets` prints this table. Each entry names its source.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["PRESETS", "Preset"]


class Preset(NamedTuple):
    description: str
    values: dict[str, Any]


PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        "GRPO as in DeepSeekMath (Shao et al. 2024): clipped ratio (eps 0.2), k3 KL to a frozen "
        "reference (beta 0.04), per-sequence mean, group-std advantages",
        {
            "grpo": {
                "loss_type": "clipped",
                "aggregation": "sequence_mean",
                "clip_epsilon": 0.2,
                "kl_coeff": 0.04,
                "kl_estimator": "k3",
                "normalize_advantages": True,
            },
            "model": {"use_reference": True},
        },
    ),
    "dr_grpo": Preset(
        "Dr. GRPO (Liu et al. 2025): no std scaling of advantages, a constant denominator "
        "(N x max completion length), no KL",
        {
            "grpo": {
                "loss_type": "clipped",
                "aggregation": "constant_length",
                "normalize_advantages": False,
                "kl_coeff": 0.0,
            },
        },
    ),
    "dapo": Preset(
        "DAPO (Yu et al. 2025): token-level mean over each optimizer step's tokens, clip-higher "
        "(eps_low 0.2, eps_high 0.28), dynamic sampling (groups with equal rewards replaced), "
        "no KL and no reference model, truncated completions masked out of the loss",
        {
            "grpo": {
                "loss_type": "clipped",
                "aggregation": "token_mean",
                "clip_epsilon": 0.2,
                "clip_epsilon_high": 0.28,
                "kl_coeff": 0.0,
                "dynamic_sampling": True,
            },
            "policy": {"mask_truncated_completions": True},
            "model": {"use_reference": False},
        },
    ),
    "reinforce": Preset(
        "on-policy REINFORCE with group-mean baselines, no ratio, no clip, "
        "no KL, no reference model, loss -(A * sum of log-probs) averaged over completions",
        {
            "grpo": {
                "loss_type": "reinforce",
                "aggregation": "sequence_sum",
                "normalize_advantages": False,
                "num_epochs_per_update": 1,
                "kl_coeff": 0.0,
            },
            "model": {"use_reference": False},
        },
    ),
    "chess": Preset(
        "the chess task at beta 0.1 (k3), lr 1e-6, temperature 0.5, top_p 0.9, G 4, "
        "4 prompts per step, length-normalised loss",
        {
            "task": {"name": "chess"},
            "prompts_per_step": 4,
            "grpo": {
                "group_size": 4,
                "batch_size": 16,
                "kl_coeff": 0.1,
                "kl_estimator": "k3",
                "aggregation": "sequence_mean",
            },
            "schedule": {"learning_rate": 1e-6},
            "policy": {"generation": {"temperature": 0.5, "top_p": 0.9}},
            "model": {"use_reference": True},
        },
    ),
}
