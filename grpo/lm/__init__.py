"""Causal language models as GRPO policies: the policy, sampling, scoring, loading and LoRA,
the reference, and the rollout engines (`grpo.lm.engines`)."""
