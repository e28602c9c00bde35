"""bench/records.py's TRAINING_PATH: a record goes stale when any module its training run
imports changes, because every such module is on the path (or set apart, with its reason)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import records  # noqa: E402

# One step of a config at a tiny size, and the package's modules imported by then.
IMPORTS_OF_RUNS = """
import json, sys
from pathlib import Path
from grpo.cli import main
for argv in json.loads(sys.argv[1]):
    assert main(argv) == 0, argv
package = Path("grpo").resolve()
files = {Path(m.__file__).resolve() for m in list(sys.modules.values())
         if getattr(m, "__file__", None)}
print(json.dumps(sorted(f.relative_to(package.parent).as_posix() for f in files
                        if f.is_relative_to(package))))
"""

SMALL = {"task.train_size": 16, "task.eval_size": 1, "prompts_per_step": 2,
         "grpo.group_size": 2, "grpo.batch_size": 4, "grpo.gradient_accumulation_steps": 1,
         "policy.micro_batch_size": 4, "policy.generation.max_new_tokens": 4,
         "schedule.num_steps": 1, "evaluation.every": 1, "evaluation.batch_size": 4,
         "run.threads": 1, "run.tensorboard": False}  # fmt: skip
# The configs the records train, and the tiny model standing in for a fetched one (None: the
# config's own shipped model).
TINY_MODEL = {"configs/smollm2_math.yaml": "llama", "configs/smollm2_math_forms.yaml": "llama",
              "configs/gemma3_math.yaml": "gemma3", "configs/demo.yaml": None,
              "configs/chess.yaml": None}  # fmt: skip


def covered(name: str, config_files: list[str]) -> bool:
    return any(name == path or name.startswith(path.rstrip("/") + "/")
               for path in [*records.TRAINING_PATH, *records.COMMAND_LINE, *config_files])  # fmt: skip


def test_every_config_a_record_trains_is_run_below():
    """A new record's config joins TINY_MODEL, so the check below runs it too."""
    trained = {path for record in records.load_records().values()
               for path in record["depends_on_paths"]
               if path.startswith("configs/") and "grpo/step" in record["depends_on_paths"]}
    assert trained == set(TINY_MODEL)


def test_every_module_a_training_run_imports_is_on_the_training_path(tmp_path, wide_gemma3):
    """One step of each config a record trains (tiny models for the fetched ones), in a fresh
    interpreter: every module of the package it imported is on TRAINING_PATH, on COMMAND_LINE
    (the runs go through `grpo.cli.main`), among the configs' own files (their tasks'), or in
    OUTSIDE_THE_NUMBERS with a reason; so a change to any of them marks the records of that
    config stale. What it does not see: the five runs
    share one interpreter (a task's files count for all), they run without the records'
    overrides, and not through a benchmark's own code (whose files its records name)."""
    from tiny_models import build_tiny_causal_lm
    from train_seeds import config_files

    from grpo.run.config_files import load_config

    models = {"llama": build_tiny_causal_lm(tmp_path / "llama", "llama", max_positions=1024),
              "gemma3": wide_gemma3}  # fmt: skip
    runs, own = [], set()
    for index, (config, arch) in enumerate(TINY_MODEL.items()):
        sets = {**SMALL, "run.dir": tmp_path / f"run-{index}"}
        if arch:
            sets["model.path"] = models[arch]
        overrides = [f"{key}={value}" for key, value in sets.items()]
        runs.append(["train", config, *[a for o in overrides for a in ("--set", o)]])
        own.update(config_files(load_config(REPO / config, overrides)))
    done = subprocess.run([sys.executable, "-c", IMPORTS_OF_RUNS, json.dumps(runs, default=str)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.splitlines()[-1])
    assert "grpo/lm/engines/lean_families.py" in imported and "grpo/tasks/chess.py" in imported
    missing = [name for name in imported
               if not covered(name, sorted(own)) and name not in records.OUTSIDE_THE_NUMBERS]
    assert missing == [], (
        f"{missing}: imported by a training run; add each to bench/records.py's TRAINING_PATH, "
        "or to OUTSIDE_THE_NUMBERS with the reason it computes nothing a record holds"
    )


def test_the_modules_set_apart_exist_and_are_not_on_the_path():
    """OUTSIDE_THE_NUMBERS names files that exist, none also on TRAINING_PATH, each with a
    reason; every TRAINING_PATH entry exists."""
    for name, reason in records.OUTSIDE_THE_NUMBERS.items():
        assert (REPO / name).is_file() and reason and not covered(name, []), name
    assert all((REPO / path).exists() for path in records.TRAINING_PATH)


def test_every_training_record_depends_on_the_whole_training_path():
    """A record of a training run lists every entry of its `training_paths` (TRAINING_PATH,
    and the command line for bench/train_seeds.py's), so a change to any of them marks it
    stale (`python bench/records.py --extend NAME` adds what an older record lacks)."""
    assert records.training_paths({"command": "python bench/roofline.py"}) == records.TRAINING_PATH
    for through_cli in ("python bench/train_seeds.py x",
                        "python bench/time_to_accuracy.py --grpo-run runs/bench/x/seed-0"):
        assert records.training_paths({"command": through_cli}) == [
            *records.TRAINING_PATH, "grpo/__main__.py", "grpo/cli/__init__.py"]
    for name, record in records.load_records().items():
        if "grpo/step" in record["depends_on_paths"]:
            lacking = records.lacking_paths(record)
            assert lacking == [], f"{name} lacks {lacking}: python bench/records.py --extend {name}"


def _at_head(name: str) -> dict[str, str]:
    """`name`'s files at HEAD, digested from git's own listing and bytes."""
    head, digests = records._git("rev-parse", "HEAD"), {}
    for file in records._git("ls-tree", "-r", "--name-only", head, "--", name).splitlines():
        data = subprocess.run(["git", "show", f"{head}:{file}"], cwd=REPO, capture_output=True,
                              check=True).stdout  # fmt: skip
        digests[file] = records.content_digest(file, data)
    return digests


def test_a_record_extended_by_a_path_is_digested_at_the_commit_it_stands_for(tmp_path):
    """`extend` adds the paths a record of a training run lacks, digested at its last verified
    commit (else its own), once; a path that commit lacks is left out. Refused: a record of
    uncommitted files, one of no training run, one whose commit git does not have."""
    head = records._git("rev-parse", "HEAD")
    own = ["grpo/config.py", "grpo/step"]
    record = {"name": "probe", "commit": "0" * 40, "dirty": ["grpo/x.py"], "hashing": "meaning",
              "depends_on_paths": own, "depends_on": {**_at_head(own[0]), **_at_head(own[1])},
              "verified": [{"commit": head}]}  # fmt: skip
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps(record))
    paths = [*own, "grpo/lm/engines/lean_families.py", "grpo/distributed", "grpo/no_such.py"]
    records.extend(["probe"], folder=tmp_path, paths=paths)
    extended = json.loads(probe.read_text())
    added = ["grpo/lm/engines/lean_families.py", "grpo/distributed"]
    assert extended["depends_on_paths"] == [*own, *added]
    assert extended["depends_on"] == {**record["depends_on"], **_at_head(added[0]),
                                      **_at_head(added[1])}  # fmt: skip
    assert "grpo/distributed/single.py" in extended["depends_on"]
    assert extended["extended"] == [{"commit": head, "paths": added}]
    records.extend(["probe"], folder=tmp_path, paths=paths)
    assert json.loads(probe.read_text()) == extended  # nothing left to add
    refused = {"uncommitted": {k: v for k, v in record.items() if k != "verified"},
               "not a record of a training run": {**record, "depends_on_paths": own[:1]},
               "not in this repository": {**record, "verified": [{"commit": "f" * 40}]}}
    for reason, bad in refused.items():
        probe.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=reason):
            records.extend(["probe"], folder=tmp_path, paths=paths)
