"""Tests for grpo.precision: names, autocast, the stalled-update estimate and its warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo.precision import (
    check_precision,
    compute_dtype,
    compute_precision,
    update_stall_share,
    warn_if_updates_stall,
)


def test_old_spellings_map_to_one_name_and_unknown_ones_name_the_field():
    """Aliases map to their PRECISIONS name; anything else raises naming the field."""
    assert check_precision("x", "bf16") == "bf16-mixed"
    assert check_precision("x", "bfloat16") == "bf16-mixed"
    assert check_precision("x", "float16") == "fp16-mixed"
    assert check_precision("x", "fp32") == "fp32"
    with pytest.raises(
        ValueError, match=r"policy.precision: got 'bf32'; allowed: fp32, bf16-mixed"
    ):
        check_precision("policy.precision", "bf32")


def test_bf16_mixed_runs_matmuls_in_bfloat16_with_float32_gradients():
    """Under bf16-mixed a linear layer outputs bfloat16; its fp32 weight gets an fp32 gradient
    equal to the bf16 product's; fp32 changes nothing."""
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with compute_precision("bf16-mixed", "cpu"):
        y = layer(x)
        assert compute_dtype(torch.float32, "cpu") == torch.bfloat16
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    expected = torch.ones(2, 3).T @ x.bfloat16().float()  # dL/dW = 1^T x, x rounded to bf16
    torch.testing.assert_close(layer.weight.grad, expected, rtol=1e-2, atol=1e-2)
    with compute_precision("fp32", "cpu"):
        assert layer(x).dtype == torch.float32
        assert compute_dtype(torch.float32, "cpu") == torch.float32


def test_stall_share_by_hand():
    """ulp(w)/2 > lr counts as stalled: w = 1 has half-ulp 2^-8 in bf16 (2^-11 in fp16),
    w = 2^-10 has 2^-18 (2^-21); zeros and float32 tensors never count."""
    w = torch.tensor([1.0, 1.0, 2.0**-10, 0.0])
    lr = 1e-3  # between 2^-18 and 2^-8, and between 2^-21 and 2^-11
    assert update_stall_share([w.bfloat16()], lr) == (0.5, 4)
    assert update_stall_share([w.half()], lr) == (0.0, 4)  # 2^-11 < 1e-3: w = 1 moves in fp16
    assert update_stall_share([w.half()], 1e-4) == (0.5, 4)
    assert update_stall_share([w], lr) == (0.0, 0)
    assert update_stall_share([w.bfloat16()], 2.0**-7) == (0.0, 4)  # 2^-8 < lr: moves


def test_stall_share_predicts_which_bf16_weights_an_adam_step_changes():
    """One AdamW step of lr = 1e-6 (|step| = lr) changes a bf16 weight exactly when the
    estimate says it can: measured changed share == 1 - stall share, up to the weights at an
    exact power of two (a step towards zero sees the finer spacing below)."""
    torch.manual_seed(0)
    w = (torch.randn(20_000) * torch.logspace(-6, 0, 20_000)).bfloat16().requires_grad_()
    before = w.detach().clone()
    share, _ = update_stall_share([w], 1e-6)
    w.grad = torch.randn_like(w)
    torch.optim.AdamW([w], lr=1e-6, weight_decay=0.0).step()
    changed = (w.detach() != before).double().mean().item()
    powers_of_two = (torch.frexp(before.float())[0].abs() == 0.5).double().mean().item()
    assert 0.2 < share < 0.8  # the draw spans both sides of the boundary
    assert abs(changed - (1 - share)) <= powers_of_two < 0.01


def test_warning_names_the_numbers_and_the_key_and_stays_quiet_when_updates_land():
    """A bf16 weight set at lr 1e-6 warns with the share and points to policy.precision;
    the same weights in float32, or at a large lr, do not."""
    w = torch.full((100,), 0.02).bfloat16()
    with pytest.warns(UserWarning, match=r"100.0% of the 100 .*policy.precision: bf16-mixed"):
        assert warn_if_updates_stall([w], 1e-6) == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_updates_stall([w.float()], 1e-6)
        warn_if_updates_stall([w], 1e-3)


def test_autocasts_weight_cache_is_off_while_any_sampling_thread_holds_it():
    """Two holders whose lifetimes overlap: the cache stays off until the last releases it,
    a release without a hold never turns it off again, and a forked process drops them all."""
    from grpo.precision import compute_precision, hold_weight_cache_off, release_weight_cache

    def cache_on() -> bool:
        with compute_precision("bf16-mixed", "cpu"):
            return torch.is_autocast_cache_enabled()

    assert cache_on()
    hold_weight_cache_off()
    hold_weight_cache_off()
    release_weight_cache()
    assert not cache_on()  # the second holder still runs
    release_weight_cache()
    assert cache_on()
    release_weight_cache()
    assert cache_on()
    hold_weight_cache_off()
    hold_weight_cache_off()
    release_weight_cache(everything=True)
    assert cache_on()
