"""Checkpoints: bitwise resume, atomic writes, pickle-free loading, every RNG restored."""

import os
import random

import numpy as np
import pytest
import torch
from toy_models import SequencePolicy, TablePolicy, best_arm_reward, token_count_reward

from grpo import GRPOConfig, GRPOTrainer, checkpoint

CONFIG = GRPOConfig(
    group_size=3,
    batch_size=4,
    num_epochs_per_update=2,
    kl_coeff=0.05,
    ref_update_frequency=2,
    learning_rate=0.05,
)
STATES = [0, 1, 2]


def _trainer(seed):
    return GRPOTrainer(
        SequencePolicy(3, 4, max_length=3, seed=seed), token_count_reward(), config=CONFIG
    )


def test_resume_is_bitwise_identical(tmp_path):
    """k steps, save, load into a fresh trainer, n - k more == n straight steps, bitwise."""
    torch.manual_seed(0)
    straight = _trainer(seed=0)
    for _ in range(5):
        straight.train_step(STATES)

    torch.manual_seed(0)
    first = _trainer(seed=0)
    for _ in range(2):
        first.train_step(STATES)
    first.save_checkpoint(tmp_path / "ck.pt")
    torch.manual_seed(123)  # the resumed process starts from other random state and weights
    resumed = _trainer(seed=1)
    resumed.load_checkpoint(tmp_path / "ck.pt")
    for _ in range(3):
        resumed.train_step(STATES)

    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(
        straight.reference_policy.parameters(), resumed.reference_policy.parameters(), strict=True
    ):
        assert torch.equal(a, b)
    assert resumed.step_count == 5 and resumed.epoch_count == 10
    measured = ("time/", "throughput/", "memory/")  # wall time and memory: never reproducible
    strip = [{k: v for k, v in m.items() if not k.startswith(measured)} for m in straight.history]
    assert [
        {k: v for k, v in m.items() if not k.startswith(measured)} for m in resumed.history
    ] == strip


def test_every_rng_is_restored(tmp_path):
    """After load, Python, NumPy, torch and the shuffling generator repeat the saved draws."""
    trainer = GRPOTrainer(TablePolicy(3, 3), best_arm_reward(3, 3))
    trainer.save_checkpoint(tmp_path / "ck.pt")
    draws = (
        random.random(),
        np.random.rand(),
        torch.rand(1),
        torch.rand(1, generator=trainer.generator),
    )
    trainer.load_checkpoint(tmp_path / "ck.pt")
    again = (
        random.random(),
        np.random.rand(),
        torch.rand(1),
        torch.rand(1, generator=trainer.generator),
    )
    assert (
        draws[:2] == again[:2]
        and torch.equal(draws[2], again[2])
        and torch.equal(draws[3], again[3])
    )


def test_plain_policy_restored_in_place(tmp_path):
    """A non-Module policy is saved via get_parameters and restored into the same tensors."""
    torch.manual_seed(0)
    policy = TablePolicy(3, 3)
    trainer = GRPOTrainer(policy, best_arm_reward(3, 3), config=GRPOConfig(entropy_coeff=0.0))
    trainer.train_step(STATES)
    saved = policy.logits.detach().clone()
    trainer.save_checkpoint(tmp_path / "ck.pt", best_loss=0.25)
    trainer.train_step(STATES)
    assert not torch.equal(policy.logits, saved)
    tensor_before = policy.logits
    state = trainer.load_checkpoint(tmp_path / "ck.pt")
    assert policy.logits is tensor_before and torch.equal(policy.logits.detach(), saved)
    assert trainer.optimizer.param_groups[0]["params"][0] is policy.logits
    assert state["best_loss"] == 0.25 == trainer.best_loss and trainer.step_count == 1
    assert len(trainer.history) == 1


def test_crash_before_rename_keeps_previous_checkpoint(tmp_path, monkeypatch):
    """If the process dies between write and rename, the old file is intact and loadable."""
    torch.manual_seed(0)
    trainer = GRPOTrainer(
        TablePolicy(3, 3), best_arm_reward(3, 3), config=GRPOConfig(entropy_coeff=0.0)
    )
    trainer.train_step(STATES)
    path = tmp_path / "latest.pt"
    trainer.save_checkpoint(path)
    original = path.read_bytes()
    trainer.train_step(STATES)

    def crash(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        trainer.save_checkpoint(path)
    monkeypatch.undo()
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]  # no temp file left
    fresh = GRPOTrainer(
        TablePolicy(3, 3), best_arm_reward(3, 3), config=GRPOConfig(entropy_coeff=0.0)
    )
    fresh.load_checkpoint(path)
    assert fresh.step_count == 1


class Payload:
    """An arbitrary object: loading it would mean running pickled code."""


def test_loading_never_unpickles_objects(tmp_path):
    """A file holding an arbitrary Python object is refused, not executed."""
    path = tmp_path / "evil.pt"
    torch.save(
        {"format_version": 1, "policy": Payload(), "optimizer": {}, "step_count": 0, "rng": {}},
        path,
    )
    with pytest.raises(ValueError, match="not a readable grpo checkpoint"):
        checkpoint.load(path)


def test_incomplete_or_truncated_file_rejected(tmp_path):
    """A checkpoint missing entries, or cut short, fails with a message naming the file."""
    path = tmp_path / "partial.pt"
    torch.save({"format_version": 1, "policy": {}}, path)
    with pytest.raises(ValueError, match="lacks required entries: optimizer, step_count, rng"):
        checkpoint.load(path)
    trainer = GRPOTrainer(TablePolicy(3, 3), best_arm_reward(3, 3))
    trainer.save_checkpoint(tmp_path / "full.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "full.pt").read_bytes()[:200])
    with pytest.raises(ValueError, match="cut.pt"):
        checkpoint.load(tmp_path / "cut.pt")
