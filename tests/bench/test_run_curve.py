"""bench/run_curve.py on hand-written runs: any evaluation metric, several runs, null values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import run_curve  # noqa: E402


def _run(folder: Path, coverage: list[float | None]) -> Path:
    """Two training steps of 10 and 30 s, an evaluation after each and one at the start."""
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/greedy/coverage": coverage[0], "eval/greedy/length_mean": 48.0}]
    for step, seconds in ((1, 10.0), (2, 30.0)):
        rows.append({"step": step, "time/step": seconds, "reward/mean": -0.5 + step / 10})
        rows.append({"step": step, "eval/greedy/coverage": coverage[step]})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_several_runs_print_any_metric_and_null_as_a_dash(tmp_path, capsys):
    """Each run's table has its evaluations at their cumulative training seconds; a metric
    logged as null (a nan) prints as "-", a share as a percentage; the figure is written."""
    a = _run(tmp_path / "a", [0.0, 0.25, 0.5])
    b = _run(tmp_path / "b", [0.0, None, 0.125])
    png = tmp_path / "curve.png"
    run_curve.main([str(a), str(b), "--keys", "eval/greedy/coverage", "--png", str(png)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a" and lines[1] == "| step | training s | greedy/coverage | greedy length |"
    assert lines[3:6] == ["| 0 | 0 | 0.0 % | 48.0 |", "| 1 | 10 | 25.0 % | nan |",
                          "| 2 | 40 | 50.0 % | nan |"]  # fmt: skip
    assert lines[6] == "b" and lines[10:12] == ["| 1 | 10 | - | nan |", "| 2 | 40 | 12.5 % | nan |"]
    assert png.stat().st_size > 0


def test_runs_with_one_folder_name_are_refused(tmp_path):
    """Runs are told apart by folder name: two of one name would share a line style."""
    a = _run(tmp_path / "x" / "run", [0.0, 0.1, 0.2])
    b = _run(tmp_path / "y" / "run", [0.0, 0.1, 0.2])
    with pytest.raises(SystemExit):
        run_curve.main([str(a), str(b)])
