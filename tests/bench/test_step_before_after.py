"""bench/step_before_after.py: the two commits run in turns, each in its own checkout, and
each phase's ratio is after over before per unit of counted work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import step_before_after as sba  # noqa: E402


def _roofline(loss_s: float, loss_gflop: float, optimizer_s: float, peak: float,
              tokens: float = 100.0) -> dict:  # fmt: skip
    phases = [
        {"phase": "loss_backward", "name": "loss forward + backward", "seconds": loss_s,
         "flops": loss_gflop * 1e9},
        {"phase": "optimizer", "name": "optimizer (clip + AdamW)", "seconds": optimizer_s,
         "flops": None},
    ]  # fmt: skip
    return {"phases": phases, "peaks": {"matmul": {"bfloat16": {"flops_per_s": peak * 1e9}}},
            "tokens_per_step": {"completions": 4, "completion_tokens_mean": tokens / 4}}


def test_a_ratio_is_of_seconds_per_token_pair_by_pair_and_of_seconds_for_the_optimizer():
    """Before 10 s for 100 completion tokens, after 6 s for 80: (6/80) / (10/100) = 0.75 (the
    GFLOP counted do not enter); the second pair 0.5 (5 s against 10 s for 100 tokens each):
    median 0.625. The optimizer compares seconds: 0.4 / 0.5 = 0.8 and 0.6 / 0.5 = 1.2."""
    runs = {"before": [_roofline(10, 1000, 0.5, 800), _roofline(10, 1000, 0.5, 800)],
            "after": [_roofline(6, 700, 0.4, 800, tokens=80), _roofline(5, 1000, 0.6, 800)]}  # fmt: skip
    phases = sba.compare(runs)
    assert phases["loss_backward"]["ratios"] == pytest.approx([0.75, 0.5])
    assert phases["loss_backward"]["median_ratio"] == pytest.approx(0.625)
    assert phases["optimizer"]["ratios"] == pytest.approx([0.8, 1.2])
    assert set(phases) == {"loss_backward", "optimizer"}  # phases no run measured are left out
    table = sba.table({"phases": phases})
    row = "| loss forward + backward | 10.00, 10.00 | 6.00, 5.00 | 100, 80 | 1000, 700 | 0.75, 0.50 | 0.62 |"
    assert row in table


def test_the_commits_run_in_turns_each_in_a_checkout_of_itself_removed_afterwards():
    """before, after, before, after; each run's checkout is at its commit; no worktree is
    left behind."""
    seen = []

    def run(tree: Path, config: str, steps: int) -> dict:
        seen.append((tree.name, sba.subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree,
                                                   capture_output=True, text=True).stdout.strip()))  # fmt: skip
        return _roofline(10, 1000, 0.5, 800)

    before_trees = sba.git("worktree", "list")
    args = sba.parse_args(["--before", "HEAD", "--after", "HEAD", "--rounds", "2"])
    results = sba.measure(args, run=run)
    head = sba.git("rev-parse", "HEAD")
    assert seen == [("before", head), ("after", head)] * 2
    assert results["commits"] == {"before": head, "after": head}
    assert results["phases"]["loss_backward"]["median_ratio"] == pytest.approx(1.0)
    assert sba.git("worktree", "list") == before_trees


def test_an_unknown_commit_is_refused_with_gits_message():
    with pytest.raises(RuntimeError, match="no-such-commit"):
        sba.measure(sba.parse_args(["--before", "no-such-commit"]), run=lambda *a: {})
