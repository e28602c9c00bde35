"""`ComputeCopy`: forward and backward on a bfloat16 copy of the model, float32 masters kept.

Under `policy.precision: bf16-copy` (`grpo.precision`) the policy scores, and its
loss's backward runs, on a copy of the model whose floating-point parameters are
all bfloat16: matrix products, norms, the residual stream and attention compute
in bfloat16, as a model loaded in bfloat16 would. The model itself keeps its
float32 weights (the masters), their gradients and the optimizer's state:

- every gradient the copy receives lands on its master at once, in float32
  (a hook after the copy's gradient is accumulated adds it to the master's
  `.grad` and frees the copy's), so micro-batches accumulate in float32 and the
  optimizer steps the masters as it would without the copy, and an update
  smaller than bfloat16's spacing near a weight still moves it;
- the copy is re-cast from the masters (round to nearest) when any of them
  changed since its last cast (`current()`, which checks the masters' in-place
  version counters: an optimizer step, a loaded checkpoint), so a step's
  forwards all read the weights the optimizer left.

Against bf16-mixed (autocast over the float32 model), the copy casts each weight
once per optimizer step rather than at every use, and runs the residual
stream, norms and attention in bfloat16 rather than float32; its log-probs
differ from autocast's by that rounding (`tests/lm/test_compute_copy.py` bounds
it on the tiny test model). On the word-problem steps measured it gains little or
nothing over autocast (`bench/loss_phase.py`, docs/performance.md), so it is not the
default. Buffers (rotary frequencies) stay as they are. A LoRA model's copy is a LoRA
model too: its adapters' gradients land on the masters' adapters the same way. Frozen
parameters get no hook.

The copy costs one more set of weights in bfloat16 (half the float32 model).
Data-parallel training reduces the masters' gradients through hooks the copy
would bypass, so bf16-copy runs on one process only (`grpo.run.train.build_loop`).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import Tensor, nn

__all__ = ["ComputeCopy"]


class ComputeCopy:
    """A copy of `model` with its floating-point parameters in `dtype` (see above).

    `pairs`: (copy's parameter, the model's) by name, every parameter of the copy.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.source = model
        self.model = copy.deepcopy(model)
        masters = dict(model.named_parameters())
        self.pairs: list[tuple[Tensor, Tensor]] = []
        for name, mine in self.model.named_parameters():
            master = masters[name]
            if mine.is_floating_point():
                mine.data = mine.data.to(dtype)
            if master.requires_grad:
                mine.register_post_accumulate_grad_hook(functools.partial(_land, master))
            self.pairs.append((mine, master))
        self._versions = self._master_versions()

    def current(self) -> nn.Module:
        """The copy, re-cast first if a master changed since its last cast, in the model's
        own train or eval mode."""
        if self._master_versions() != self._versions:
            self.refresh()
        if self.model.training != self.source.training:
            self.model.train(self.source.training)
        return self.model

    def refresh(self) -> None:
        """Cast the masters' current values into the copy."""
        with torch.no_grad():
            for mine, master in self.pairs:
                mine.copy_(master)
        self._versions = self._master_versions()

    def _master_versions(self) -> tuple[int, ...]:
        return tuple(master._version for _, master in self.pairs)


def _land(master: Tensor, mine: Tensor) -> None:
    """The copy's accumulated gradient added to its master's, in the master's dtype."""
    grad = mine.grad
    if master.grad is None:
        master.grad = grad.to(master.dtype)
    else:
        master.grad.add_(grad)
    mine.grad = None
