"""bench/stale_records.py: a record is listed when a file it depends on changed (or would), with
the way back that fits where it was measured, and a record that depends on no such file is not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import records  # noqa: E402
import stale_records  # noqa: E402

HERE = records.machine()
OTHER = {**HERE, "cpu": "Some Other CPU", "flags": ["avx2", "amx_bf16"]}
SEEDS = "python bench/train_seeds.py configs/demo.yaml --name {name} --seeds 0"
CURVE = "python bench/time_to_accuracy.py --seeds 1 --record {name}"
BENCH = "python bench/roofline.py --record {name}"
VS_TRL = ("python bench/time_to_accuracy.py --workload smollm2 --libraries trl "
          "--grpo-run runs/bench/smollm2_math/seed-0 --grpo-run=runs/bench/smollm2_math/seed-1 "
          "--record {name}")  # fmt: skip
AFTER = ("python bench/word_problem_diagnosis.py --after runs/bench/smollm2_math/seed-1/c "
         "--record {name}")  # fmt: skip


def _write(folder: Path, name: str, command: str, machine: dict, paths: list[str],
           digests: dict | None = None) -> None:  # fmt: skip
    """A record depending on `paths`, digested as they are now unless `digests` says otherwise."""
    depends = records.file_hashes(paths, records.REPO, "meaning") if digests is None else digests
    record = {"name": name, "command": command.format(name=name), "machine": machine,
              "hashing": "meaning", "depends_on_paths": paths, "depends_on": depends}  # fmt: skip
    (folder / f"{name}.json").write_text(json.dumps(record))


def test_a_change_lists_every_record_under_it_with_its_way_back(tmp_path):
    _write(tmp_path, "seeds_here", SEEDS, HERE, ["grpo/functional", "configs/demo.yaml"])
    _write(tmp_path, "seeds_there", SEEDS, OTHER, ["grpo/functional"])
    _write(tmp_path, "curve_here", CURVE, HERE, ["grpo/functional"])
    _write(tmp_path, "bench_here", BENCH, HERE, ["grpo/functional/logprobs.py"])
    _write(tmp_path, "bench_there", BENCH, OTHER, ["grpo/functional/"])
    _write(tmp_path, "vs_trl_here", VS_TRL, HERE, ["grpo/functional"])
    _write(tmp_path, "untouched", BENCH, OTHER, ["grpo/rewards/format.py"])

    rows = stale_records.report(["./grpo/functional/logprobs.py"], tmp_path)
    back = {row["name"]: row["back"] for row in rows}
    assert sorted(back) == ["bench_here", "bench_there", "curve_here", "seeds_here",
                            "seeds_there", "vs_trl_here"]  # fmt: skip
    assert back["seeds_here"] == "replay: python bench/verify_record.py seeds_here"
    assert back["seeds_there"] == (
        "replay both commits here: python bench/verify_record.py seeds_there"
    )
    assert back["curve_here"] == "replay: python bench/verify_record.py curve_here"
    assert back["bench_here"] == "measure again here: " + BENCH.format(name="bench_here")
    assert back["bench_there"] == (
        "measure again on its CPU (Some Other CPU): " + BENCH.format(name="bench_there")
    )
    # its runs' record is not among them: nothing to bring back first
    assert back["vs_trl_here"] == "measure again here: " + VS_TRL.format(name="vs_trl_here")
    assert all(row["files"] == ["grpo/functional/logprobs.py"] for row in rows)
    assert [row["elsewhere"] for row in rows if row["name"].endswith("_here")] == [False] * 4


def test_a_record_that_read_runs_comes_back_after_their_record(tmp_path):
    _write(tmp_path, "smollm2_math", SEEDS, OTHER, ["grpo/step"])
    _write(tmp_path, "vs_trl", VS_TRL, OTHER, ["grpo/step", "bench/time_to_accuracy.py"])
    _write(tmp_path, "diagnosis", AFTER, OTHER, ["grpo/step"])

    rows = stale_records.report(["grpo/step/trainer.py"], tmp_path)
    back = {row["name"]: row["back"] for row in rows}
    assert back["vs_trl"] == ("bring back smollm2_math first, then measure again on its CPU "
                              "(Some Other CPU): " + VS_TRL.format(name="vs_trl"))  # fmt: skip
    assert back["diagnosis"].startswith("bring back smollm2_math first, then measure again")
    # a change the runs' record does not depend on brings back the comparison alone
    alone = stale_records.report(["bench/time_to_accuracy.py"], tmp_path)
    assert [(row["name"], row["back"].split(":")[0]) for row in alone] == [
        ("vs_trl", "measure again on its CPU (Some Other CPU)")
    ]


def test_a_changed_folder_lists_the_records_of_the_files_in_it(tmp_path):
    _write(tmp_path, "one_file", BENCH, HERE, ["grpo/functional/logprobs.py"])
    _write(tmp_path, "elsewhere", BENCH, HERE, ["grpo/rewards/format.py"])
    names = [row["name"] for row in stale_records.report(["grpo/functional/"], tmp_path)]
    assert names == ["one_file"]


def test_now_lists_only_records_whose_files_changed(tmp_path, capsys):
    _write(tmp_path, "fresh", BENCH, HERE, ["grpo/functional/logprobs.py"])
    _write(tmp_path, "changed", BENCH, HERE, ["grpo/functional/logprobs.py"],
           digests={"grpo/functional/logprobs.py": "0" * 64})  # fmt: skip
    rows = stale_records.report(None, tmp_path)
    assert [(row["name"], row["files"]) for row in rows] == [
        ("changed", ["grpo/functional/logprobs.py"])
    ]


def test_a_folder_entry_does_not_cover_a_sibling_with_its_name_as_prefix():
    assert stale_records.covers("grpo/run", "grpo/run/train.py")
    assert stale_records.covers("grpo/run/", "grpo/run")
    assert not stale_records.covers("grpo/run", "grpo/runner.py")
    assert not stale_records.covers("grpo/run/train.py", "grpo/run")
