"""Which records are stale, or would be after a change, and how each one comes back.

    python bench/stale_records.py                                   # the stale records now
    python bench/stale_records.py --if grpo/run/rundir.py grpo/run/loop.py   # before a change

For each record: the files behind it that changed (or would), the CPU it was measured on, and
the way back from this machine:
- `replay`: a training run (`bench/train_seeds.py`, `bench/time_to_accuracy.py`) measured on
  this kind of CPU; `bench/verify_record.py` replays its start and compares it with the record;
- `replay both commits here`: such a run measured on another kind of CPU, whose bits this one
  cannot give; `bench/verify_record.py` replays the record's commit and the current one here;
- `measure again here`: any other benchmark measured on this kind of CPU, by its command;
- `measure again on its CPU`: a benchmark of another kind of CPU (its speed, or the bits its
  arithmetic gives), which no replay here can stand in for;
- a record that read runs of `bench/train_seeds.py` (`--grpo-run`, `--after`): measured again by
  its command, after the record of those runs, where that is stale too.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import REPO, RESULTS, stale  # noqa: E402
from verify_record import other_machine  # noqa: E402

REPLAYED = ("bench/train_seeds.py", "bench/time_to_accuracy.py")


def covers(entry: str, path: str) -> bool:
    """Whether the dependency `entry` (a file, or a folder: every file in it) holds `path`."""
    entry, path = entry.rstrip("/"), path.rstrip("/")
    return path == entry or path.startswith(entry + "/")


def touches(entry: str, changed: str) -> bool:
    """Whether a change to `changed` (a file or a folder) changes the dependency `entry`."""
    return covers(entry, changed) or covers(changed, entry)


def from_repo(path: str) -> str:
    """`path` relative to the repository's root, however it was given."""
    full = Path(path).resolve()
    return str(full.relative_to(REPO)) if full.is_relative_to(REPO) else path


def read_from_runs(command: str) -> list[str]:
    """The run directories (or checkpoints) a record's command reads: its `runs/` arguments
    (`--grpo-run runs/bench/NAME/seed-S`, `--after RUN_DIR/checkpoints/step-N`)."""
    values = [arg.partition("=")[2] if arg.startswith("--") else arg
              for arg in shlex.split(command)]  # fmt: skip
    return [value for value in values if value.startswith("runs/")]


def runs_record(path: str) -> str | None:
    """The record of `bench/train_seeds.py` whose run `path` is (`runs/bench/NAME/...`)."""
    parts = Path(path).parts
    return parts[2] if len(parts) > 2 and parts[1] == "bench" else None


def way_back(record: dict, elsewhere: bool, first: list[str] = ()) -> str:
    """How `record` comes back from this machine; `elsewhere`: measured on another CPU;
    `first`: stale records whose runs its command reads, to bring back before it."""
    command = record["command"]
    script = shlex.split(command)[1]
    prefix = f"bring back {', '.join(first)} first, then " if first else ""
    if script in REPLAYED and not read_from_runs(command):
        how = "replay both commits here" if elsewhere else "replay"
        return f"{prefix}{how}: python bench/verify_record.py {record['name']}"
    where = f"on its CPU ({record['machine']['cpu']})" if elsewhere else "here"
    return f"{prefix}measure again {where}: {command}"


def report(changed: list[str] | None = None, folder: Path = RESULTS) -> list[dict]:
    """The records stale now (`changed` None), or those a change to the `changed` files or
    folders would stale (every record depending on one of them, stale already or not): each
    with its name, files, CPU and way back."""
    changed = None if changed is None else [from_repo(path) for path in changed]
    found = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if changed is None:
            files = stale(record)
        else:
            entries = record["depends_on_paths"]
            files = sorted(p for p in changed if any(touches(e, p) for e in entries))
        if files:
            found.append((record, files))
    names = {record["name"] for record, _ in found}
    rows = []
    for record, files in found:
        elsewhere, machine = other_machine(record), record["machine"]
        first = sorted({runs_record(path) for path in read_from_runs(record["command"])} & names)
        rows.append({
            "name": record["name"], "files": files, "elsewhere": elsewhere,
            "cpu": f"{machine['cpu']} ({', '.join(machine['flags']) or 'no listed flags'})",
            "back": way_back(record, elsewhere, first),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--if", dest="changed", nargs="+", metavar="FILE",
                        help="list the records a change to these files would stale")  # fmt: skip
    args = parser.parse_args(argv)
    rows = report(args.changed)
    for row in rows:
        print(f"{row['name']}  [{row['cpu']}]")
        print(f"  files: {', '.join(row['files'])}")
        print(f"  back:  {row['back']}")
    here = sum(not row["elsewhere"] for row in rows)
    which = "stale" if args.changed is None else "that the change would stale"
    print(f"{len(rows)} records {which}: {here} measured on this kind of CPU, "
          f"{len(rows) - here} on others")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
