"""The reference policy of a LoRA (PEFT) causal-LM policy, without a second copy of the weights.

With LoRA the frozen base weights *are* the reference model: running the same
PEFT model inside `disable_adapter()` gives π_ref exactly, for the memory of
one model. This view is deliberately not an `nn.Module` and owns no
parameters, so nothing (an optimizer, `copy.deepcopy`, a checkpoint) can
duplicate or update it by accident.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from grpo.lm.scoring import score_completions
from grpo.protocols import TokenLogProbs

__all__ = ["AdapterDisabledReference"]


class AdapterDisabledReference:
    """π_ref = the policy's PEFT model with adapters off, in eval mode, without gradient."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    @property
    def training(self) -> bool:
        return False

    def train(self) -> AdapterDisabledReference:
        return self  # the view has no mode of its own: it always scores in eval mode

    def eval(self) -> AdapterDisabledReference:
        return self

    def to(self, device: Any) -> AdapterDisabledReference:
        return self  # it lives wherever the policy's model lives

    def get_parameters(self) -> dict[str, Tensor]:
        return {}

    def get_token_log_probabilities(
        self, states: Sequence[Any], actions: Sequence[Any]
    ) -> TokenLogProbs:
        model = self.policy.compute_model()  # bf16-copy's copy: the base weights in bfloat16
        was_training = model.training
        model.eval()  # no dropout in the reference, whatever mode the policy is in
        try:
            with torch.no_grad(), model.disable_adapter():
                settings = self.policy.scoring_settings()._replace(compute_entropy=False)
                out, _ = score_completions(model, actions, settings)  # log-probs only
        finally:
            model.train(was_training)
        return out

    def get_log_probabilities(self, states: Sequence[Any], actions: Sequence[Any]) -> Tensor:
        return self.get_token_log_probabilities(states, actions).logprobs.sum(-1)  # (N,)

    def generate_actions(
        self, states: Sequence[Any], num_actions_per_state: int, **kwargs: Any
    ) -> Any:
        copied = self.policy.compute_copy
        with contextlib.ExitStack() as adapters_off:
            adapters_off.enter_context(self.policy.model.disable_adapter())
            if copied is not None:  # the transformers engine may sample from the copy
                adapters_off.enter_context(copied.model.disable_adapter())
            return self.policy.generate_actions(states, num_actions_per_state, **kwargs)
