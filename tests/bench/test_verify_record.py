"""bench/verify_record.py: a replay of a record's start matches it on unchanged code (training is
deterministic on one machine), and a record whose numbers differ from the replay is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import train_seeds  # noqa: E402
import verify_record  # noqa: E402


def _record(tmp_path: Path) -> Path:
    """The demo's config at a tiny size, one seed, into a record under tmp_path."""
    tiny = ["task.train_size=64", "task.eval_size=8", "prompts_per_step=2", "grpo.batch_size=16",
            "policy.micro_batch_size=16", "schedule.num_steps=10", "evaluation.every=0",
            "run.threads=1", "run.checkpoint_every=100"]
    return train_seeds.main(["configs/demo.yaml", "--name", "tiny", "--seeds", "3",
                             *(a for o in tiny for a in ("--set", o)),
                             "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "r")])


def test_the_replayed_start_matches_and_a_changed_number_is_refused(tmp_path, capsys):
    path = _record(tmp_path)
    record = json.loads(path.read_text())
    run = record["results"]["runs"][0]
    assert run["steps"] == 10 and run["evaluations"][0]["step"] == 0
    assert verify_record.verify("tiny", folder=path.parent)
    check = json.loads(path.read_text())["verified"][0]
    # every eval/ value of step 0 and every summarised training mean over step 1 was compared
    evals = sum(k.startswith("eval/") for k in run["evaluations"][0])
    assert (check["seed"], check["steps"]) == (3, 1)
    assert check["values"] == evals + len(run["training"]) and evals > 0

    record["results"]["runs"][0]["training"]["reward/mean"]["first"] += 0.001
    path.write_text(json.dumps(record))
    assert not verify_record.verify("tiny", folder=path.parent)
    assert "reward/mean (mean of its first 1 values)" in capsys.readouterr().out
    assert "verified" not in json.loads(path.read_text())  # left as it was: stale
