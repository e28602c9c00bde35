"""bench/group_anatomy.py: the kinds, weight shares and length gaps of hand-computed groups,
and a two-prompt run of the demo config."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import group_anatomy as ga  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# G = 4. Group 0: the main check passes once (the format holds everywhere); group 1: the main
# check fails everywhere, the format alone separates two short from two long samples; group 2:
# all equal.
MAIN = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
REWARDS = MAIN + 0.1 * torch.tensor([1.0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1])
LENGTHS = torch.tensor([10, 20, 30, 40, 20, 20, 60, 60, 5, 50, 90, 7])


def test_group_kinds_name_what_separates_the_samples():
    assert ga.group_kinds(REWARDS, MAIN, 4) == ["main", "others only", "nothing"]


def test_unscaled_shares_and_length_gaps_by_hand():
    """scale none: A = [.75, -.25, -.25, -.25] (sum |A| 1.5, favoured length 10 against 30) and
    [.05, .05, -.05, -.05] (sum 0.2, 20 against 60)."""
    report = ga.anatomy(REWARDS, MAIN, LENGTHS, 4, "none")
    assert report["main"]["weight_share"] == pytest.approx(1.5 / 1.7)
    assert report["others only"]["weight_share"] == pytest.approx(0.2 / 1.7)
    assert report["nothing"] == {"groups": 1, "weight_share": 0.0, "length_gap": 0.0}
    assert report["main"]["length_gap"] == pytest.approx(-20.0)
    assert report["others only"]["length_gap"] == pytest.approx(-40.0)
    assert report["all"]["length_gap"] == pytest.approx((-15.0 - 4.0) / 0.85)


def test_group_scale_lifts_a_minor_reward_to_a_full_signal():
    """Dividing by each group's std gives the format-only group (std 0.0577) more weight than
    the group the main check separates (std 0.5); one batch std keeps the 1 : 0.1 weights."""
    group = ga.anatomy(REWARDS, MAIN, LENGTHS, 4, "group")
    minor = 0.2 / (0.1 / 3**0.5 + 1e-4)  # sum |A| of group 1: 4 x 0.05 / (std + eps)
    major = 1.5 / (0.5 + 1e-4)
    assert group["others only"]["weight_share"] == pytest.approx(minor / (minor + major))
    assert group["others only"]["weight_share"] > 0.5
    assert group["others only"]["length_gap"] == pytest.approx(-40.0)  # a group's gap: scale-free
    batch = ga.anatomy(REWARDS, MAIN, LENGTHS, 4, "batch")
    assert batch["others only"]["weight_share"] == pytest.approx(0.2 / 1.7)


def test_a_small_run_reports_every_scale():
    """The demo config (its shipped model), two prompts x G, through the real sampling and
    reward code: one row per group, lengths within the sampling limit."""
    tiny = ["prompts_per_step=2", "run.threads=1"]
    rows = ga.sample(str(REPO / "configs" / "demo.yaml"), tiny, 2)
    group_size = rows["group_size"]
    assert len(rows["rewards"]) == len(rows["main"]) == len(rows["lengths"]) == 2 * group_size
    assert all(0 < n <= 5 for n in rows["lengths"])  # demo.yaml: max_new_tokens 5
    text = ga.table(rows)
    for scale in ("group", "batch", "none"):
        assert f"| {scale} | all | 2 |" in text
