"""grpo.step.metrics: the share of counted tokens that carry gradient."""

import torch

from grpo.step.metrics import loss_token_frac


def test_loss_token_frac_counts_the_tokens_of_non_zero_advantages():
    """Advantages [0, 1, -1, 0] with 3, 2, 5, 10 counted tokens: (2 + 5) / 20 of them."""
    advantages = torch.tensor([0.0, 1.0, -1.0, 0.0])
    tokens = torch.tensor([3, 2, 5, 10])
    assert loss_token_frac(advantages, tokens) == {"loss/token_frac": 0.35}
    assert loss_token_frac(advantages, torch.zeros(4, dtype=torch.long))["loss/token_frac"] == 0
