"""bench/gpu_check.py on a machine without CUDA: it completes, reporting every part skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))


def test_without_cuda_every_part_is_reported_skipped_in_valid_json(tmp_path):
    """Exit status 0; one JSON with every part of the check "skipped" and a reason; the table
    names each part."""
    from gpu_check import all_parts

    out = tmp_path / "check.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["cuda"] is False and report["device"] == "cpu"
    assert set(report["parts"]) == set(all_parts())
    assert any(name.startswith("vllm/") for name in report["parts"])
    assert any(name.startswith("step/smollm2-135m/") for name in report["parts"])
    for name, part in report["parts"].items():
        assert part["status"] == "skipped" and "no CUDA device" in part["reason"], name
        assert name in done.stdout
