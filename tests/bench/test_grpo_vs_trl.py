"""The side-by-side benchmark runs at a tiny size and reports what it promises (no timing asserts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("psutil")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import grpo_vs_trl  # noqa: E402
from common import Workload, build_model  # noqa: E402
from workers import WORKERS  # noqa: E402

TINY = Workload(model="tiny", prompts=2, group_size=2, max_new_tokens=4, steps=1, threads=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("bench") / "tiny", "tiny")


@pytest.mark.parametrize("trainer", sorted(WORKERS))
def test_each_trainer_reports_times_tokens_and_memory(model_dir, trainer):
    """One timed step per trainer: a positive time, N x <= T tokens, a peak RSS above setup."""
    record = WORKERS[trainer](model_dir, TINY)
    assert len(record["step_s"]) == len(record["tokens"]) == TINY.steps
    assert all(t > 0 for t in record["step_s"])
    N = TINY.prompts * TINY.group_size
    assert all(0 < n <= N * TINY.max_new_tokens for n in record["tokens"])
    assert record["peak_rss_mib"] >= record["setup_rss_mib"] > 0


def test_summary_ratio_and_overhead_follow_the_records():
    """s/step is the median, the ratio divides medians, the overhead compares time per token."""
    records = {
        "grpo": [{"step_s": [1.0, 3.0], "tokens": [10, 10], "setup_rss_mib": 1, "peak_rss_mib": 4}],
        "trl": [{"step_s": [4.0, 4.0], "tokens": [10, 10], "setup_rss_mib": 2, "peak_rss_mib": 8}],
        "bare": [{"step_s": [1.0, 1.0], "tokens": [5, 5], "setup_rss_mib": 1, "peak_rss_mib": 2}],
    }
    summary = {name: grpo_vs_trl.summarise(r) for name, r in records.items()}
    grpo_vs_trl.compare(summary)
    assert summary["grpo"]["step_s"] == 2.0 and summary["grpo"]["tokens_per_s"] == 5.0
    assert summary["grpo/trl"] == 0.5
    assert summary["grpo/bare per token - 1"] == pytest.approx(0.0)  # 0.2 s/token both
    assert summary["trl"]["step_rss_mib"] == 6
    assert "| grpo | 2.000 |" in grpo_vs_trl.table(summary)


def test_script_runs_end_to_end(model_dir, tmp_path):
    """The command line: subprocess per run, a JSON summary with the workload."""
    out = tmp_path / "summary.json"
    argv = ["--model", "tiny", "-B", "2", "-G", "2", "-T", "4", "--steps", "1", "--runs", "1"]
    argv += ["--threads", "1", "--trainers", "bare", "--model-dir", str(model_dir)]
    summary = grpo_vs_trl.main([*argv, "--json", str(out)])
    assert out.is_file() and summary["bare"]["steps"] == 1
    assert summary["workload"]["max_new_tokens"] == 4
