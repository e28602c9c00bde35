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
BENCH = "python bench/roofline.py --record {name}"
VS_TRL = ("python bench/time_to_accuracy.py --workload smollm2 --libraries trl "
          "--grpo-run runs/bench/smollm2_math/seed-0 --grpo-run runs/bench/smollm2_math/seed-1 "
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
    _write(tmp_path, "bench_here", BENCH, HERE, ["grpo/functional/logprobs.py"])
    _write(tmp_path, "bench_there", BENCH, OTHER, ["grpo/functional/"])
    _write(tmp_path, "vs_trl", VS_TRL, OTHER, ["grpo/functional"])
    _write(tmp_path, "untouched", BENCH, OTHER, ["grpo/rewards/format.py"])

    rows = stale_records.report(["grpo/functional/logprobs.py"], tmp_path)
    back = {row["name"]: row["back"] for row in rows}
    assert sorted(back) == ["bench_here", "bench_there", "seeds_here", "seeds_there", "vs_trl"]
    assert back["seeds_here"] == "replay: python bench/verify_record.py seeds_here"
    assert (
        back["seeds_there"] == "replay both commits here: python bench/verify_record.py seeds_there"
    )
    assert back["bench_here"] == "measure again here: " + BENCH.format(name="bench_here")
    assert back["bench_there"].startswith(
        "measure again on its CPU (Some Other CPU): python bench/roofline.py"
    )
    assert back["vs_trl"].startswith(
        "verify smollm2_math first, then measure again on Some Other CPU: "
    )
    assert all(row["files"] == ["grpo/functional/logprobs.py"] for row in rows)
    assert [row["elsewhere"] for row in rows if row["name"].endswith("_here")] == [False, False]


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
