"""optimizer_windows: which samples each optimizer step and each mini-batch holds."""

from types import SimpleNamespace

import torch

from grpo.distributed.single import SingleProcess
from grpo.records import Rollout
from grpo.step.minibatch import optimizer_windows

B, G = 4, 8
N = B * G


def _rollout() -> Rollout:
    """N samples; sample n belongs to group n // G."""
    return Rollout(
        states=[f"prompt {n // G}" for n in range(N)],
        actions=[f"completion {n}" for n in range(N)],
        rewards=torch.zeros(N),
    )


def _windows(batch_size: int, accumulation: int, advantages: torch.Tensor, skip: bool = False):
    config = SimpleNamespace(batch_size=batch_size, gradient_accumulation_steps=accumulation)
    generator = torch.Generator().manual_seed(3)
    tokens = torch.full((N,), 5)
    windows = optimizer_windows(
        _rollout(), advantages, tokens, config, generator, SingleProcess(), skip
    )
    return [[mb.samples.actions for mb in window] for window in windows]


def test_one_window_per_rollout_cut_into_groups_gives_one_group_per_mini_batch():
    """batch_size G x accumulation B: one optimizer step whose mini-batches are the B groups,
    each in sample order (each group's prompt runs once, its activations alone in memory)."""
    windows = _windows(G, B, torch.randn(N))
    assert len(windows) == 1
    groups = [[f"completion {i * G + j}" for j in range(G)] for i in range(B)]
    assert windows[0] == groups


def test_windows_are_shuffled_and_each_holds_its_samples_in_sample_order():
    """Several optimizer steps: the windows differ from the sample order (shuffled), together
    hold every sample once, and each lists its samples in sample order across its mini-batches."""
    windows = _windows(4, 2, torch.randn(N))  # 4 optimizer steps of 8 samples
    assert len(windows) == 4
    ids = [[int(a.split()[1]) for mb in w for a in mb] for w in windows]
    assert sorted(sum(ids, [])) == list(range(N))
    assert all(w == sorted(w) for w in ids)
    assert ids != [list(range(k, k + 8)) for k in range(0, N, 8)]  # not the unshuffled cut


def test_a_group_whose_advantages_are_all_zero_is_not_run():
    """With skip_zero, a mini-batch that is one all-zero group disappears from its window."""
    advantages = torch.randn(N)
    advantages[G : 2 * G] = 0.0  # group 1 carries no signal
    windows = _windows(G, B, advantages, skip=True)
    assert [mb[0] for mb in windows[0]] == ["completion 0", "completion 16", "completion 24"]
