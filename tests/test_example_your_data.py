"""examples/your_data: the README's "your model on your data" files run as shipped."""

from __future__ import annotations

import importlib.util
import json
import runpy
import shutil
from pathlib import Path

import pytest

from grpo.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "your_data"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (EXAMPLE / name).read_text().splitlines()]


def test_the_data_files_are_what_make_data_writes_and_held_out_rows_stay_out(tmp_path):
    """make_data.py rewrites both files byte for byte; no test prompt is a training prompt;
    every answer is its prompt's sum."""
    copy = tmp_path / "your_data"
    shutil.copytree(EXAMPLE, copy)
    runpy.run_path(str(copy / "make_data.py"), run_name="__main__")
    for name in ("train.jsonl", "test.jsonl"):
        assert (copy / name).read_bytes() == (EXAMPLE / name).read_bytes()
    train, test = rows("train.jsonl"), rows("test.jsonl")
    assert len(train) == 2000 and len(test) == 200
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for row in train + test:
        a, b = row["prompt"].removesuffix("=").split("+")
        assert int(row["answer"]) == int(a) + int(b)


def test_the_reward_functions_score_by_hand():
    """correct: the stripped completion is the answer, as written also when the data hold it
    as a number; digits_only: a bare number."""
    spec = importlib.util.spec_from_file_location("rewards", EXAMPLE / "rewards.py")
    rewards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rewards)
    completions = [" 152", "152 apples", "15", "abc"]
    assert rewards.correct([], completions, ["152"] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert rewards.correct([], completions, [152] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert rewards.digits_only([], completions) == [1.0, 0.0, 1.0, 0.0]


def test_the_shipped_config_trains_two_steps_and_logs_both_rewards(tmp_path, monkeypatch):
    """`grpo train examples/your_data/config.yaml`, run from the repository's root as the
    README says, at two steps: both reward functions are logged, and held-out accuracy is
    evaluated before and after."""
    monkeypatch.chdir(REPO)
    run = tmp_path / "run"
    overrides = ["schedule.num_steps=2", "evaluation.every=0", f"run.dir={run}"]
    assert main(["train", "examples/your_data/config.yaml",
                 *(a for o in overrides for a in ("--set", o))]) == 0  # fmt: skip
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 2
    assert all({"rewards/correct/mean", "rewards/digits_only/mean"} <= set(m) for m in steps)
    assert [m["step"] for m in metrics if "eval/greedy/accuracy" in m] == [0, 2]


@pytest.mark.parametrize("line", [3, 17])
def test_a_bad_row_is_named_before_the_model_loads(tmp_path, monkeypatch, line, capsys):
    """A row without the "answer" column that `correct` requires: exit 2, the file and line
    named, no run directory left."""
    monkeypatch.chdir(REPO)
    data = (EXAMPLE / "train.jsonl").read_text().splitlines()
    data[line - 1] = json.dumps({"prompt": "1+1="})
    bad = tmp_path / "train.jsonl"
    bad.write_text("\n".join(data) + "\n")
    run = tmp_path / "run"
    code = main(["train", "examples/your_data/config.yaml", "--set", f"task.train_file={bad}",
                 "--set", f"run.dir={run}"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"line {line}" in err and "'answer'" in err and not run.exists()
