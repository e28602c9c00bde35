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
- a comparison whose grpo side was read from runs (`--grpo-run`): the record of those runs
  first, then the comparison's own command, on the CPU that measured it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import RESULTS, stale  # noqa: E402
from verify_record import other_machine  # noqa: E402

REPLAYED = ("bench/train_seeds.py", "bench/time_to_accuracy.py")


def covers(entry: str, path: str) -> bool:
    """Whether the dependency `entry` (a file, or a folder: every file in it) holds `path`."""
    entry, path = entry.rstrip("/"), path.rstrip("/")
    return path == entry or path.startswith(entry + "/")


def read_from_runs(command: str) -> list[str]:
    """The records whose runs a comparison read (`--grpo-run runs/bench/NAME/seed-S`)."""
    args = shlex.split(command)
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--grpo-run"]
    return sorted({Path(path).parent.name for path in paths})


def way_back(record: dict, elsewhere: bool) -> str:
    """How `record` comes back from this machine; `elsewhere`: measured on another CPU."""
    command = record["command"]
    script = shlex.split(command)[1]
    cpu = record["machine"]["cpu"]
    if script == "bench/time_to_accuracy.py" and "--grpo-run" in command:
        first = ", ".join(read_from_runs(command))
        where = f"on {cpu}" if elsewhere else "here"
        return f"verify {first} first, then measure again {where}: {command}"
    if script in REPLAYED:
        how = "replay both commits here" if elsewhere else "replay"
        return f"{how}: python bench/verify_record.py {record['name']}"
    if elsewhere:
        return f"measure again on its CPU ({cpu}): {command}"
    return f"measure again here: {command}"


def report(changed: list[str] | None = None, folder: Path = RESULTS) -> list[dict]:
    """The records stale now (`changed` None), or those a change to the `changed` files would
    stale (every record depending on one of them, stale already or not): each with its
    name, files, CPU and way back."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if changed is None:
            files = stale(record)
        else:
            files = sorted(p for p in changed
                           if any(covers(e, p) for e in record["depends_on_paths"]))  # fmt: skip
        if not files:
            continue
        elsewhere = other_machine(record)
        machine = record["machine"]
        rows.append({
            "name": record["name"], "files": files, "elsewhere": elsewhere,
            "cpu": f"{machine['cpu']} ({', '.join(machine['flags']) or 'no listed flags'})",
            "back": way_back(record, elsewhere),
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
