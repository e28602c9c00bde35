"""bench/chess_results.py and train_seeds.training_summary: the chess page's tables on hand-made
records, every figure computed by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import chess_results  # noqa: E402
from train_seeds import training_summary  # noqa: E402


def _source(*records):
    return "SOURCE " + " ".join(r["name"] for r in records)


def _run(seed: int, before: float, after: float, share: float, kl: float = 0.02) -> dict:
    evaluation = {"eval/greedy/reward_mean": before, "eval/greedy/precision": 0.6,
                  "eval/greedy/coverage": 0.5, "eval/sampled/reward_mean": before - 0.01,
                  "eval/sampled/precision": 0.6, "eval/sampled/coverage": 0.5,
                  "eval/sampled/kl_mean": 0.0}  # fmt: skip
    end = {**evaluation, "eval/greedy/reward_mean": after, "eval/greedy/precision": 0.7,
           "eval/greedy/coverage": 0.55, "eval/sampled/reward_mean": after - 0.02,
           "eval/sampled/kl_mean": kl}  # fmt: skip
    return {"seed": seed, "steps": 10, "training_seconds": 100.0, "median_step_seconds": 0.5,
            "wall_seconds": 120.0, "flags": [],
            "training": {"loss/kl_share": {"all": share, "first": 0.0, "last": share + 0.1},
                         "entropy/mean": {"all": 0.3, "first": 0.32, "last": 0.28}},
            "evaluations": [{"step": 10, **end}, {"step": 0, **evaluation}],
            "end_of_output": ["held-out evaluation  before  after", f"seed {seed}"]}  # fmt: skip


def _records() -> dict:
    def record(name: str, gains: tuple[float, ...], share: float) -> dict:
        runs = [_run(i, 0.4, 0.4 + g, share) for i, g in enumerate(gains)]
        return {"name": name, "results": {"runs": runs}}

    return {
        "chess": record("chess", (0.05, 0.06, 0.07), 0.5),
        "chess_beta_1": record("chess_beta_1", (0.01, 0.02, 0.03), 0.9),
        "chess_beta_0.3": record("chess_beta_0.3", (0.02, 0.03, 0.04), 0.7),
        "chess_beta_0": record("chess_beta_0", (0.06, 0.07, 0.08), 0.0),
    }


def test_changes_are_each_seeds_end_minus_its_start():
    """Evaluations are read by step, not by order: the change is step 10's minus step 0's."""
    gains = chess_results.changes(_records()["chess"], "eval/greedy/reward_mean")
    assert gains == pytest.approx([0.05, 0.06, 0.07], abs=1e-12)


def test_seeds_table_and_verdict_by_hand():
    """Before 0.400, afters 0.450/0.460/0.470, mean change +0.060; the final rewards span 0.020
    and the smallest gain 0.050 is 2.5x that; the chess loop's change, 0.421 - 0.468 = -0.047,
    is labelled as quoted and not comparable."""
    text = chess_results.seeds(_records(), _source)
    assert "| greedy reward | 0.400 | 0.450 | 0.460 | 0.470 | +0.060 (+0.050, +0.060, +0.070) |" in text
    assert "| greedy precision (legal share of the listed moves) | 0.600 | 0.700 |" in text
    assert "| sampled KL to the starting model, per token | 0.000 | 0.020 |" in text
    assert "exceeds the spread of their final rewards (0.020), the smallest by 2.5x" in text
    assert ("Quoted for reference, not comparable (another model, another reward function, not "
            "measured here): the chess loop's own report gives its run's reward as 0.468 -> 0.421 "
            "(-0.047).") in text
    assert "| 0 | 10 | 100 s | 0.50 s | 120 s | 0.320 -> 0.280 | 0.500 | no |" in text
    assert text.endswith("SOURCE chess")


def test_a_gain_within_the_spread_is_said_to_be_so():
    """Gains 0.01 and 0.05 end 0.04 apart: the smaller gain does not exceed that spread."""
    record = {"name": "chess", "results": {"runs": [_run(0, 0.4, 0.41, 0.5), _run(1, 0.4, 0.45, 0.5)]}}
    assert "the smallest gain does not exceed the spread of the final rewards (0.040)" in (
        chess_results.verdict(record)
    )


def test_output_is_seed_0s_last_lines_in_a_code_block():
    """The table `grpo train` printed last, for the first seed, fenced as code."""
    text = chess_results.output(_records(), _source)
    assert text.startswith("```\nheld-out evaluation  before  after\nseed 0\n```\n\nSOURCE chess")


def test_sweep_rows_by_hand():
    """One row per beta in the sweep's order, with its mean change, the KL share of the loss
    over the run and in its last tenth, and the chess loop's figures where it ran that beta."""
    text = chess_results.sweep(_records(), _source)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "beta" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 0.3", "| 0.1", "| 0"]
    assert rows[0].startswith("| 1 | 10 | +0.020 (+0.010, +0.020, +0.030) | +0.010 | +0.100 | +0.050 |")
    assert "| 90.0 % (100.0 %) | 0.020 | -0.065, 97.0 % |" in rows[0]
    assert rows[2].endswith("| 50.0 % (60.0 %) | 0.020 | -0.047, 77.5 % |")
    assert rows[3].endswith("| 0.0 % (10.0 %) | 0.020 | not run |")
    assert "| quoted, not comparable: the chess loop's reward change, KL share |" in text
    assert "quoted from the chess loop's own report, not measured here" in text
    assert text.endswith("SOURCE chess_beta_1 chess_beta_0.3 chess chess_beta_0")


def test_summary_sentence_by_hand():
    """The before and the seeds' final range in one sentence, without the chess loop's quoted
    run (another model and reward: not comparable)."""
    text = chess_results.summary(_records(), _source)
    assert text.startswith("GRPO at the chess loop's settings raises the shipped chess model's held-out "
                           "greedy reward from 0.400 to 0.450-0.470 (3 seeds, 10 steps).\n\n")  # fmt: skip
    assert "0.468" not in text and "0.421" not in text


def test_training_summary_means_over_all_first_and_last_tenth():
    """20 steps: the first and last tenth are 2 steps each; rows without a key (evaluations)
    and keys never logged are left out."""
    rows = [{"step": i, "time/step": 1.0, "loss/kl_share": i / 10, "entropy/mean": 1.0}
            for i in range(1, 21)] + [{"step": 20, "eval/greedy/reward_mean": 0.5}]  # fmt: skip
    summary = training_summary(rows)
    assert set(summary) == {"loss/kl_share", "entropy/mean"}
    assert summary["loss/kl_share"] == pytest.approx({"all": 1.05, "first": 0.15, "last": 1.95})
    assert summary["entropy/mean"] == {"all": 1.0, "first": 1.0, "last": 1.0}
