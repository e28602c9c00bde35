"""Tests for grpo.precision: names, autocast, auto and the bfloat16 speed check, the
stalled-update estimate and its warning, a weight cast once while it is unchanged."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import grpo.precision
from grpo.precision import (
    bfloat16_speedup,
    cast_once,
    check_precision,
    compute_dtype,
    compute_precision,
    resolve_precision,
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


def test_auto_is_a_name_only_where_the_field_allows_it():
    """auto passes where `auto=True`, is listed among the allowed names there, and raises
    naming the field elsewhere."""
    assert check_precision("policy.precision", "auto", auto=True) == "auto"
    with pytest.raises(ValueError, match=r"policy.precision: got 'autoo'; allowed: .*, auto$"):
        check_precision("policy.precision", "autoo", auto=True)
    with pytest.raises(ValueError, match=r"x: got 'auto'; allowed: fp32, .*float16$"):
        check_precision("x", "auto")


@pytest.mark.parametrize("speedup, chosen", [(2.3, "bf16-mixed"), (0.14, "fp32")])
def test_auto_takes_bfloat16_exactly_where_it_is_faster(monkeypatch, speedup, chosen):
    """On a CPU, auto resolves to bf16-mixed when bfloat16 matrix products beat float32 (2.3x
    on a Xeon with AMX) and to fp32 when they are slower (0.14x on an AVX2-only EPYC); explicit
    names pass unchanged, and a device with no check gets fp32."""
    monkeypatch.setattr(grpo.precision, "bfloat16_speedup", lambda: speedup)
    assert resolve_precision("policy.precision", "auto", "cpu") == chosen
    for name in ("fp32", "fp16-mixed"):
        assert resolve_precision("policy.precision", name, "cpu") == name
    assert resolve_precision("policy.precision", "auto", "meta") == "fp32"


def test_bf16_mixed_by_hand_where_bfloat16_is_slower_warns_naming_field_and_speed(monkeypatch):
    """bf16-mixed set explicitly stays bf16-mixed; where bfloat16 is slower one warning names
    the field and the measured speed, where it is faster there is none."""
    monkeypatch.setattr(grpo.precision, "bfloat16_speedup", lambda: 0.14)
    with pytest.warns(UserWarning, match=r"rollout.precision: bf16-mixed, but .* at 0.14x"):
        assert resolve_precision("rollout.precision", "bf16-mixed", "cpu") == "bf16-mixed"
    monkeypatch.setattr(grpo.precision, "bfloat16_speedup", lambda: 2.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_precision("rollout.precision", "bf16-mixed", "cpu") == "bf16-mixed"


class _Clock:
    """perf_counter replaced: each product "takes" the next of the given durations."""

    def __init__(self, durations):
        self.durations, self.now, self.reads = list(durations), 0.0, 0

    def __call__(self):
        self.reads += 1
        if self.reads % 2 == 0:  # the end of a timed product: its duration has passed
            self.now += self.durations.pop(0)
        return self.now


def test_the_speedup_is_float32s_best_of_3_over_bfloat16s_measured_once(monkeypatch):
    """With product times float32 (5, 3, 4) and bfloat16 (2, 1, 6) the speedup is best over
    best, 3 / 1; a second call measures nothing (cached for the process)."""
    clock = _Clock([5.0, 3.0, 4.0, 2.0, 1.0, 6.0])
    monkeypatch.setattr(grpo.precision.time, "perf_counter", clock)
    bfloat16_speedup.cache_clear()
    try:
        assert bfloat16_speedup() == 3.0
        assert bfloat16_speedup() == 3.0 and clock.reads == 12 and not clock.durations
    finally:
        bfloat16_speedup.cache_clear()  # the real clock's measurement for later tests


def test_measuring_the_speedup_leaves_torchs_global_generator_alone():
    """A run seeds torch, then resolves `auto`: the measurement draws nothing from the global
    generator, so the numbers drawn after it are the ones drawn without it."""
    bfloat16_speedup.cache_clear()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    speedup = bfloat16_speedup()
    assert math.isfinite(speedup) and speedup > 0
    assert torch.equal(torch.get_rng_state(), state)


def test_bf16_mixed_runs_matmuls_in_bfloat16_with_float32_gradients():
    """Under bf16-mixed a linear layer outputs bfloat16; its fp32 weight gets an fp32 gradient
    equal to the bf16 product's; fp32 changes nothing."""
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with compute_precision("bf16-mixed", "cpu"):
        y = layer(x)
        assert compute_dtype(torch.float32, "cpu") == torch.bfloat16
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    # dL/dW = 1^T x, the product taken in bfloat16 (x rounded to it) and its result in float32
    expected = (torch.ones(3, 2, dtype=torch.bfloat16) @ x.bfloat16()).float()
    torch.testing.assert_close(layer.weight.grad, expected, rtol=0, atol=0)
    assert not torch.equal(layer.weight.grad, torch.ones(3, 2) @ x)  # not the float32 product
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


@pytest.mark.parametrize("foreach", [False, True])
def test_a_cast_is_made_once_and_again_after_each_change_of_the_weight(foreach):
    """cast_once gives one bfloat16 tensor (the same object) while the weight is unchanged,
    equal to weight.bfloat16(); after an AdamW step (per-tensor or foreach) and after a
    load_state_dict it gives a new cast of the new values; a weight already in the dtype is
    returned itself."""
    layer = torch.nn.Linear(8, 16, bias=False)
    first = cast_once(layer.weight, torch.bfloat16)
    assert cast_once(layer.weight, torch.bfloat16) is first
    assert torch.equal(first, layer.weight.detach().bfloat16()) and not first.requires_grad
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, foreach=foreach)
    layer(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    stepped = cast_once(layer.weight, torch.bfloat16)
    assert stepped is not first and torch.equal(stepped, layer.weight.detach().bfloat16())
    assert not torch.equal(stepped, first)
    layer.load_state_dict({"weight": torch.zeros(16, 8)})
    assert torch.equal(cast_once(layer.weight, torch.bfloat16), torch.zeros(16, 8).bfloat16())
    assert cast_once(layer.weight, torch.float32) is layer.weight
    layer.to("meta")  # moves the data without moving the version counter
    assert cast_once(layer.weight, torch.bfloat16).device == torch.device("meta")
