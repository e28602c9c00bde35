"""bench/loss_phase.py on the shipped demo model: two values of a setting timed on one batch,
the first one's gap and difference to itself exactly 0, the other's as the setting implies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import loss_phase  # noqa: E402
import pytest  # noqa: E402


def test_the_demo_batch_under_bf16_mixed_and_bf16_copy_side_by_side(tmp_path, monkeypatch):
    """One timed round: a record with both precisions, each round's ratio to bf16-mixed (1 for
    itself), log-probs and gradients identical for the first; for bf16-copy different but
    within bfloat16 rounding of a tiny model's (a gap below 0.5, gradients within 20 %)."""
    monkeypatch.chdir(REPO)
    argv = ["configs/demo.yaml", "--rounds", "1", "--record", "loss_precision_test",
            "--set", "schedule.num_steps=1"]  # fmt: skip
    results = loss_phase.main(argv, folder=tmp_path)
    record = json.loads((tmp_path / "loss_precision_test.json").read_text())
    assert record["results"] == json.loads(json.dumps(results))
    assert record["command"].startswith("python bench/loss_phase.py configs/demo.yaml")
    assert {"grpo/lm/compute_copy.py", "grpo/tasks", "configs/demo.yaml",
            "bench/loss_phase.py"} <= set(record["depends_on_paths"])  # fmt: skip
    mixed, copied = results["runs"]
    assert results["field"] == "precision"
    assert (mixed["value"], copied["value"]) == ("bf16-mixed", "bf16-copy")
    assert mixed["ratios"] == [1.0] and len(copied["ratios"]) == 1 and copied["ratios"][0] > 0
    assert mixed["logprob_gap_max"] == 0.0 and mixed["grad_rel_diff"] == 0.0
    assert 0 < copied["logprob_gap_max"] < 0.5 and 0 < copied["grad_rel_diff"] < 0.2
    table = loss_phase.table(results)
    assert table.count("\n") == 3 and "| bf16-copy |" in table


def test_a_bool_setting_compared_and_a_wrong_field_named(tmp_path, monkeypatch):
    """--compare share_prompt_prefix=false,true on the demo: sharing changes the log-probs by
    float rounding only (a gap below 1e-4); a field that is no policy setting is refused."""
    monkeypatch.chdir(REPO)
    argv = ["configs/demo.yaml", "--rounds", "1", "--compare", "share_prompt_prefix=false,true",
            "--set", "schedule.num_steps=1"]  # fmt: skip
    results = loss_phase.main(argv)
    plain, shared = results["runs"]
    assert (results["field"], plain["value"], shared["value"]) == (
        "share_prompt_prefix", "false", "true")
    assert shared["logprob_gap_max"] < 1e-4 and shared["grad_rel_diff"] < 1e-3
    assert "| share_prompt_prefix | loss phase s" in loss_phase.table(results)
    with pytest.raises(ValueError, match="--compare: got 'no_such'"):
        loss_phase.setting_values("no_such", ["1", "2"])
