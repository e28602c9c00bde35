"""Our loss and TRL's GRPOTrainer loss agree on identical inputs for every shared loss type."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from common import Workload  # noqa: E402
from loss_equality import TRL_LOSS_TYPES, ours, random_inputs, theirs  # noqa: E402
from trl_side import make_trl_trainer  # noqa: E402


@pytest.fixture(scope="module")
def trl_trainer(tiny_lm_dir, tmp_path_factory):
    work = Workload(model="tiny", prompts=2, group_size=2, max_new_tokens=4, steps=0)
    return make_trl_trainer(tiny_lm_dir("qwen2"), work, tmp_path_factory.mktemp("trl"))


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("trl_loss_type", sorted(TRL_LOSS_TYPES))
def test_loss_and_gradient_equal_trl(trl_trainer, trl_loss_type, beta):
    """Same inputs -> the same loss and d loss / d logprobs as TRL's _compute_loss, to 1e-5."""
    inputs = random_inputs(seed=len(trl_loss_type))
    eps, eps_high = 0.2, 0.28
    loss, grad = ours(inputs, trl_loss_type, beta, eps, eps_high)
    trl_loss, trl_grad = theirs(trl_trainer, inputs, trl_loss_type, beta, eps, eps_high)
    assert grad.abs().max() > 1e-3  # a real gradient, not two zero tensors
    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-5, atol=1e-5)


def test_inputs_exercise_the_clip():
    """The random inputs put some ratios outside [0.8, 1.28] and have ragged lengths."""
    inputs = random_inputs()
    ratio = (inputs.logprobs - inputs.old_logprobs).exp()[inputs.completion_mask]
    assert ((ratio < 0.8) | (ratio > 1.28)).any() and ((ratio > 0.8) & (ratio < 1.28)).any()
    assert len(set(inputs.completion_mask.sum(1).tolist())) > 1
