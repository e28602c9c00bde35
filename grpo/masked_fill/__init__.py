"""Masked fill-in (diffusion-style) models as GRPO policies, rewarded by a frozen judge
(the fill-in plan)."""
