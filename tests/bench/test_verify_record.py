"""bench/verify_record.py: a replay of a record's start matches it on unchanged code (training is
deterministic on one machine), and a record whose numbers differ from the replay is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import provenance  # noqa: E402
import records  # noqa: E402
import time_to_accuracy  # noqa: E402
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
    assert run["precision"] == "fp32"  # as the run resolved it (the demo's config says fp32)
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


def test_a_curve_record_replays_grpos_run_to_its_second_evaluation(tmp_path, capsys):
    """A `time_to_accuracy.py` record: grpo's run of seed 0 (the demo at a tiny size, six
    steps, evaluated every three) replays to the same figures at steps 0 and 3, and the record
    then depends on the whole training path it replayed; a changed figure at step 3 is refused."""
    tiny = ["task.train_size=64", "task.eval_size=8", "prompts_per_step=2", "grpo.batch_size=16",
            "policy.micro_batch_size=16", "schedule.num_steps=6", "run.threads=1"]  # fmt: skip
    args = time_to_accuracy.parse_args(["--seeds", "1", "--eval-every", "3", "--libraries", "grpo",
                                        *(a for o in tiny for a in ("--set", o))])  # fmt: skip
    run = time_to_accuracy.run("grpo", 0, args, tiny)
    assert [p["step"] for p in run["points"]] == [0, 3, 6]
    record = {"name": "curve", "command": "python bench/time_to_accuracy.py --eval-every 3",
              "commit": "x", "dirty": [], "depends_on_paths": ["configs/demo.yaml"],
              "machine": records.machine(),
              "hashing": "meaning", "depends_on": records.file_hashes(["configs/demo.yaml"]),
              "results": {"overrides": tiny, "per_library": {"grpo": []}, "records": [run]}}  # fmt: skip
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(record))
    assert verify_record.verify("curve", folder=tmp_path)
    verified = json.loads(path.read_text())
    check = verified["verified"][0]
    # the replay ran today's training path: the record now depends on all of it
    assert set(verified["depends_on_paths"]) == {"configs/demo.yaml", *records.TRAINING_PATH}
    assert records.stale(verified) == []
    assert check["steps"] == 3 and check["values"] == 2 * (len(run["points"][0]) - 3)
    record["results"]["records"][0]["points"][1]["accuracy"] += 0.125
    path.write_text(json.dumps(record))
    assert not verify_record.verify("curve", folder=tmp_path)
    assert "step 3 accuracy" in capsys.readouterr().out


def test_a_record_from_another_machine_is_checked_against_its_own_commit_replayed_here(
        tmp_path, monkeypatch):  # fmt: skip
    """Measured elsewhere (its numbers rounded otherwise): the replay at this commit is
    compared with a replay of the record's commit on this machine, not with the record, and
    the check says so."""
    path = _record(tmp_path)
    record = json.loads(path.read_text())
    record["results"]["runs"][0]["training"]["reward/mean"]["first"] += 0.001  # elsewhere's
    path.write_text(json.dumps(record))
    monkeypatch.setattr(verify_record, "other_machine", lambda record: True)
    assert verify_record.verify("tiny", folder=path.parent)
    check = json.loads(path.read_text())["verified"][0]
    assert check["against"]["commit"] == record["commit"] and check["values"] > 0
    rendered = provenance.checked(check)
    assert "gives the same numbers with this commit's code as with the measured commit's" in rendered


def test_a_comparison_whose_grpo_side_came_from_other_runs_is_refused(tmp_path):
    """A `time_to_accuracy.py` record made with `--grpo-run` holds no grpo run of its own to
    replay: refused, naming where its grpo side came from."""
    record = {"name": "vs", "command": "python bench/time_to_accuracy.py --libraries trl "
              "--grpo-run runs/bench/smollm2_math/seed-0", "depends_on_paths": []}  # fmt: skip
    (tmp_path / "vs.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="read from runs of bench/train_seeds.py"):
        verify_record.verify("vs", folder=tmp_path)
