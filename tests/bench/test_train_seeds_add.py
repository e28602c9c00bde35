"""bench/train_seeds.py --add-to: more seeds join a record measured earlier only under the same
settings and unchanged files (--remeasure: seeds it holds, measured again, replace their runs
only where they compute the same numbers); each run keeps its own commit and date, and the record's command
is the one invocation that would measure every seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import provenance  # noqa: E402
import seed_records  # noqa: E402
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


def test_a_remeasured_seed_replaces_its_run_only_where_it_computes_the_same_numbers(tmp_path):
    """Training is deterministic on one machine: measured again, seed 3 reproduces every
    evaluation and training mean, so its new run replaces the old and the record keeps what the
    old one measured of time; a record whose numbers the run does not reproduce (one accuracy
    changed by hand here) is refused and left byte for byte as it was."""
    path = _measure(tmp_path, ["3"])
    first = json.loads(path.read_text())
    again = json.loads(_measure(tmp_path, ["3"], "--add-to", "--remeasure").read_text())
    (old,), (new,) = first["results"]["runs"], again["results"]["runs"]
    assert seed_records.same_numbers(old, new) == []
    assert new["seed"] == 3 and new["commit"] == again["commit"]
    assert again["results"]["remeasured"] == [
        {"seed": 3, "commit": first["commit"], "date": first["date"],
         **{k: old[k] for k in seed_records.TIMING_KEYS}}]  # fmt: skip
    assert "--remeasure" not in again["command"] and "--seeds 3 --set" in again["command"]

    key = next(k for k in new["evaluations"][-1] if k.startswith("eval/"))
    new["evaluations"][-1][key] += 0.125  # a number this run would not compute
    path.write_text(json.dumps(again))
    before = path.read_bytes()
    with pytest.raises(SystemExit, match="seed 3 computed other evaluations"):
        _measure(tmp_path, ["3"], "--add-to", "--remeasure")
    assert path.read_bytes() == before


def test_remeasure_is_refused_for_seeds_not_held_or_measured_on_another_cpu(tmp_path):
    path = _measure(tmp_path, ["3"])
    with pytest.raises(SystemExit, match="only with --add-to"):
        _measure(tmp_path, ["3"], "--remeasure")
    with pytest.raises(SystemExit, match=r"holds seeds \[3\], not \[4\]"):
        _measure(tmp_path, ["4"], "--add-to", "--remeasure")
    record = json.loads(path.read_text())
    record["machine"] = {**record["machine"], "cpu": "another CPU"}
    path.write_text(json.dumps(record))
    with pytest.raises(SystemExit, match=r"seeds \[3\] were measured on another CPU"):
        _measure(tmp_path, ["3"], "--add-to", "--remeasure")


def test_the_pages_name_a_remeasured_seed_and_its_first_runs_time():
    record = {"commit": "b" * 40, "date": "2026-12-05 15:00 UTC", "machine": {"cpu": "cpu"},
              "results": {"runs": [{"seed": 1, "commit": "b" * 40, "date": "2026-12-05 15:00 UTC"}],
                          "remeasured": [{"seed": 1, "commit": "a" * 40, "date": "2026-12-05 13:00 UTC",
                                          "training_seconds": 1828.1, "flags": ["load 2.6 > 1"]}]}}  # fmt: skip
    assert provenance.remeasured(record) == (
        " Measured again on the same CPU, computing the same evaluations and training means to "
        "the last digit, and replaced: seed 1's first run, at commit aaaaaaa, 2026-12-05 13:00 "
        "UTC, took 1828 s of training (load 2.6 > 1).")
    assert provenance.remeasured({"results": {"runs": []}}) == ""


def test_the_load_is_read_once_it_settles_or_when_the_wait_runs_out():
    """On 2 cores a load of 1.8 decaying to 0.9 is read after two waits of 5 s; a load that
    stays at 1.8 is read as 1.8 once the 10 s allowed are spent, and no wait is made at 0."""
    import common

    def reader(values):
        it = iter(values)
        return lambda: next(it)

    slept: list[float] = []
    load = common.settled_load(60, 2, reader([1.8, 1.4, 0.9, 0.5]), slept.append)
    assert (load, slept) == (0.9, [5.0, 5.0])
    slept.clear()
    assert common.settled_load(10, 2, reader([1.8] * 9), slept.append) == 1.8
    assert slept == [5.0, 5.0]
    assert common.settled_load(0, 2, reader([1.8]), slept.append) == 1.8 and len(slept) == 2
