"""bench/output_layer_precision.py at tiny shapes: both dtypes timed in every repetition, the
ratio is bfloat16's time over float32's, the log-probs differ by bfloat16 rounding, and the
record depends on the output layer's code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import output_layer_precision as olp  # noqa: E402


def test_a_record_of_both_dtypes_at_tiny_shapes(tmp_path, monkeypatch):
    monkeypatch.setattr(olp, "SHAPES", {"trained": (16, 300, True), "frozen": (24, 500, False)})
    argv = ["--rows", "40", "--reps", "2", "--threads", "1", "--record", "olp_test"]
    results = olp.main(argv, folder=tmp_path)
    record = json.loads((tmp_path / "olp_test.json").read_text())
    assert record["results"] == json.loads(json.dumps(results))
    assert record["command"] == "python bench/output_layer_precision.py " + " ".join(argv)
    assert "grpo/functional/output_layer.py" in record["depends_on_paths"]
    for name, (H, V, trains) in olp.SHAPES.items():
        shape = results["shapes"][name]
        assert (shape["H"], shape["V"], shape["output_layer_trains"]) == (H, V, trains)
        assert all(len(shape["seconds"][dtype]) == 2 for dtype in olp.DTYPES)
        times = shape["seconds"]
        want = [b / f for b, f in zip(times["bfloat16"], times["float32"], strict=True)]
        assert shape["ratios"] == want
        assert shape["gflop"] == 2 * 40 * H * V * (4 if trains else 3) / 1e9
        assert 1e-5 < shape["logprob_gap_max"] < 0.1  # the products really differ, by rounding
    table = olp.table(results)
    assert all(shape["cast_seconds"] > 0 for shape in results["shapes"].values())
    assert table.count("\n") == 3 and "| frozen | 500 x 24, frozen |" in table
