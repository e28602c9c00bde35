"""Tests for run directories: complete checkpoints only, verified before use, logs cut back on resume."""

from __future__ import annotations

import json

import pytest
import torch

from grpo.run.rundir import RunDirectory, truncate_jsonl


def state(step: int) -> dict:
    return {"step": step, "weights": torch.full((64,), float(step))}


def test_checkpoints_have_manifests_and_old_ones_are_pruned(tmp_path):
    """Each checkpoint folder holds state.pt and a manifest with its size and SHA-256; keep=2 keeps 2."""
    run = RunDirectory(tmp_path)
    for step in (2, 4, 6):
        run.save_checkpoint(step, state(step), keep=2)
    assert run.complete_steps() == [4, 6]
    manifest = json.loads((run.checkpoints / "step-000006" / "manifest.json").read_text())
    size = (run.checkpoints / "step-000006" / "state.pt").stat().st_size
    assert manifest["step"] == 6 and manifest["files"]["state.pt"]["bytes"] == size
    assert len(manifest["files"]["state.pt"]["sha256"]) == 64
    step, loaded = run.latest_checkpoint()
    assert step == 6 and torch.equal(loaded["weights"], state(6)["weights"])


@pytest.mark.parametrize(
    ("damage", "reported"),
    [
        (
            lambda folder: (folder / "state.pt").write_bytes(b"torn"),
            "corrupt: state.pt has 4 bytes",
        ),
        (lambda folder: (folder / "manifest.json").unlink(), "incomplete: manifest.json"),
        (lambda folder: (folder / "state.pt").unlink(), "incomplete: state.pt is missing"),
    ],
)
def test_a_damaged_latest_checkpoint_is_reported_and_the_previous_one_used(
    tmp_path, damage, reported
):
    """A truncated, unmanifested or emptied newest checkpoint is named in a warning and skipped."""
    run = RunDirectory(tmp_path)
    run.save_checkpoint(3, state(3), keep=5)
    run.save_checkpoint(5, state(5), keep=5)
    damage(run.checkpoints / "step-000005")
    with pytest.warns(RuntimeWarning, match=f"step-000005 is {reported}"):
        step, loaded = run.latest_checkpoint()
    assert step == 3 and loaded["step"] == 3


def test_same_size_corruption_is_caught_by_the_checksum(tmp_path):
    """Flipping one byte of the state file (same size) fails the SHA-256 check."""
    run = RunDirectory(tmp_path)
    run.save_checkpoint(1, state(1), keep=5)
    run.save_checkpoint(2, state(2), keep=5)
    path = run.checkpoints / "step-000002" / "state.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="does not match its SHA-256"):
        assert run.latest_checkpoint()[0] == 1


def test_a_save_cut_short_leaves_only_a_partial_folder_that_is_ignored(tmp_path):
    """A kill during a save leaves `.step-N.partial`: never loaded, removed on resume."""
    run = RunDirectory(tmp_path)
    run.save_checkpoint(4, state(4), keep=5)
    partial = run.checkpoints / ".step-000008.partial"
    partial.mkdir()
    (partial / "state.pt").write_bytes(b"half a file")
    assert run.latest_checkpoint()[0] == 4
    assert not partial.exists()
    assert RunDirectory(tmp_path / "empty").latest_checkpoint() is None


def test_truncate_keeps_rows_up_to_the_step_and_drops_a_torn_line(tmp_path):
    """Log rows after the resumed step, and a half-written last line, are removed."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "x": s} for s in (0, 1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "x"')
    truncate_jsonl(path, 2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:3]


def test_a_new_run_refuses_a_folder_with_files(tmp_path):
    """run.dir that already holds a run is an error pointing to --resume."""
    run = RunDirectory(tmp_path)
    run.create("a: 1\n")
    with pytest.raises(FileExistsError, match="--resume"):
        RunDirectory(tmp_path).create("a: 1\n")
