"""Masked fill-in (diffusion-style) models as GRPO policies, rewarded by a frozen judge
(seed 002)."""
