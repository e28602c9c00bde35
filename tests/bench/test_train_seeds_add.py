"""bench/train_seeds.py --add-to: more seeds join a record measured earlier only under the same
settings and unchanged files; each run keeps its own commit and date, and the record's command
is the one invocation that would measure every seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import train_seeds  # noqa: E402

TINY = ["task.train_size=64", "task.eval_size=8", "prompts_per_step=2", "grpo.batch_size=16",
        "policy.micro_batch_size=16", "schedule.num_steps=2", "evaluation.every=0",
        "run.threads=1", "run.checkpoint_every=100"]  # fmt: skip


def _measure(tmp_path: Path, seeds: list[str], *more: str) -> Path:
    return train_seeds.main(["configs/demo.yaml", "--name", "tiny", "--seeds", *seeds,
                             *(a for o in TINY for a in ("--set", o)), *more,
                             "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "r")])  # fmt: skip


def test_added_seeds_join_the_record_with_their_own_commit(tmp_path):
    first = json.loads(_measure(tmp_path, ["3"]).read_text())
    joined = json.loads(_measure(tmp_path, ["4"], "--add-to").read_text())
    runs = joined["results"]["runs"]
    assert [run["seed"] for run in runs] == [3, 4]
    assert runs[0] == {"commit": first["commit"], "date": first["date"],
                       "machine": first["machine"], **first["results"]["runs"][0]}  # fmt: skip
    assert runs[1]["commit"] == joined["commit"] and "date" in runs[1]
    assert runs[1]["machine"] == joined["machine"]
    assert len(set(joined["depends_on_paths"])) == len(joined["depends_on_paths"])
    assert "--seeds 3 4 --set" in joined["command"] and "--add-to" not in joined["command"]
    with pytest.raises(SystemExit, match="already holds seeds"):
        _measure(tmp_path, ["4"], "--add-to")
    with pytest.raises(SystemExit, match="other settings"):
        _measure(tmp_path, ["5"], "--add-to", "--set", "seed=1")


def test_a_record_depends_on_the_task_modules_its_task_imports(tmp_path):
    """config_files: a word-problem config's task module, the prompts module and the shared
    helpers it imports (a change to any may change a number); the chess task's prompts module
    too; a model folder outside the repository is not listed."""
    from grpo.run.config_files import load_config

    repo = Path(__file__).resolve().parents[2]
    config = load_config(repo / "configs" / "smollm2_math_forms.yaml", [f"model.path={tmp_path}"])
    assert train_seeds.config_files(config) == [
        "grpo/tasks/word_problems.py", "grpo/tasks/__init__.py",
        "grpo/tasks/word_problem_prompts.py",
    ]  # fmt: skip
    chess = load_config(repo / "configs" / "chess.yaml", [f"model.path={tmp_path}"])
    assert train_seeds.config_files(chess) == [
        "grpo/tasks/chess.py", "grpo/tasks/__init__.py", "grpo/tasks/chess_prompts.py",
    ]  # fmt: skip
