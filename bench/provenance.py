"""Where a rendered block's numbers come from: one line a record, with its command, commit,
date and machine, the replays that checked it since, and any staleness.

`source(*records)` ends every block `bench/render_results.py` renders; `timing_note` names the
runs whose timing `common.timing_flags` flagged.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import stale  # noqa: E402

__all__ = [
    "added", "checked", "flagged_sentence", "machine_line", "percent", "remeasured", "source",
    "stamped_runs", "table_and_note", "timing_note", "when_where",
]  # fmt: skip


def _versions(m: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in m["packages"].items() if k in ("torch", "trl"))


def machine_line(record: dict) -> str:
    m = record["machine"]
    flags = ", ".join(m["flags"]) or "no AVX-512"
    where = m["gpu"] or f"{m['cpu']} ({m['cores']} cores, {flags})"
    return f"{where}; {_versions(m)}"


def stamped_runs(record: dict) -> list[dict]:
    """The record's runs, each with the commit, date and machine it was measured at (a run
    joined by `train_seeds.py --add-to` carries its own; the others are the record's)."""
    runs = [run for run in (record.get("results") or {}).get("runs") or [] if isinstance(run, dict)]
    return [{"commit": record["commit"], "date": record["date"], "machine": record["machine"], **run}
            for run in runs]  # fmt: skip


def _seeds(runs: list[dict]) -> str:
    seeds = [str(run["seed"]) for run in runs]
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"


def when_where(record: dict) -> str:
    """A record's date, machine and commit in one cell; where its runs were measured on
    several machines or commits (`train_seeds.py --add-to`), each with its seeds."""
    runs = stamped_runs(record)
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        where = run["machine"].get("gpu") or run["machine"]["cpu"]
        groups.setdefault((where, run["commit"][:7]), []).append(run)
    if len(groups) <= 1:
        return f"{record['date'][:10]}, {machine_line(record)}, commit {record['commit'][:7]}"
    dates = sorted({run["date"][:10] for run in runs})
    versions = {_versions(run["machine"]) for run in runs}
    parts = [f"{where} ({_seeds(members)}, commit {commit})"
             for (where, commit), members in groups.items()]  # fmt: skip
    shown = " to ".join(dict.fromkeys([dates[0], dates[-1]]))
    tail = f"; {versions.pop()}" if len(versions) == 1 else ""
    return f"{shown}, {'; '.join(parts)}{tail}"


def added(record: dict) -> str:
    """For a record whose seeds were measured in several invocations (`train_seeds.py
    --add-to`, each refused unless the files were unchanged): which seed ran when."""
    runs = (record.get("results") or {}).get("runs") or []
    if not any(isinstance(run, dict) and "commit" in run for run in runs):
        return ""
    when: dict[tuple[str, str, str], list[dict]] = {}
    for run in stamped_runs(record):
        when.setdefault((run["commit"][:7], run["date"], run["machine"]["cpu"]), []).append(run)
    several = len({cpu for _, _, cpu in when}) > 1
    parts = [f"{_seeds(members)} at commit {commit}, {date}" + (f", on {cpu}" if several else "")
             for (commit, date, cpu), members in when.items()]  # fmt: skip
    return (" The seeds were measured in turn, on the same files: " + "; ".join(parts) + "."
            + remeasured(record))


def remeasured(record: dict) -> str:
    """For a record with runs `train_seeds.py --remeasure` replaced: which seeds, and what
    their first runs measured of time (the numbers they computed were the same)."""
    old = (record.get("results") or {}).get("remeasured") or []
    parts = [f"seed {run['seed']}'s first run, at commit {run['commit'][:7]}, {run['date']}, "
             f"took {run['training_seconds']:.0f} s of training"
             + (f" ({'; '.join(run['flags'])})" if run.get("flags") else "") for run in old]
    if not parts:
        return ""
    return (" Measured again on the same CPU, computing the same evaluations and training "
            "means to the last digit, and replaced: " + "; ".join(parts) + ".")


def checked(check: dict) -> str:
    """One `bench/verify_record.py` check of a record: what was replayed, against what."""
    scope = check.get("scope") or f"seed {check['seed']}'s first {check['steps']} steps"
    head = f"Still current at commit {check['commit'][:7]} ({check['date'][:10]}): a replay of {scope}"
    tool = f"({check['values']} values, `bench/verify_record.py`)"
    against = check.get("against", "record")
    if against == "record":
        return f"{head} gives the recorded numbers exactly {tool}."
    return (f"{head} on {against['cpu']} gives the same numbers with this commit's code as with "
            f"the measured commit's, {against['commit'][:7]} {tool}; the measuring CPU rounds "
            "otherwise, so the record's own numbers are not compared.")


def source(*records: dict) -> str:
    """Where the block's numbers come from, one line a record, and any staleness."""
    lines = []
    for record in records:
        changed = record.get("dirty") or []
        dirty = (f" (with uncommitted changes to {', '.join(f'`{d}`' for d in changed[:3])}"
                 f"{' and more' if len(changed) > 3 else ''})" if changed else "")  # fmt: skip
        lines.append(f"Measured by `{record['command']}` at commit {record['commit'][:7]}{dirty}, "
                     f"{record['date']}, on {machine_line(record)}.{added(record)}")  # fmt: skip
        for check in record.get("verified", [])[-1:]:  # the latest; the record keeps them all
            lines.append(checked(check))
        changed = stale(record)
        if changed:
            shown = ", ".join(f"`{name}`" for name in changed[:6])
            more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
            lines.append(f"**Stale:** {shown}{more} changed since this measurement; the numbers "
                         f"may differ now. Measure again with the command above.")  # fmt: skip
    return "\n\n".join(lines)


def percent(x: float) -> str:
    return f"{100 * x:.1f} %"


def timing_note(runs: list[dict]) -> str:
    """The runs whose timing `common.timing_flags` flagged (the machine was not quiet), or ""."""
    flagged = [f"seed {run['seed']} ({'; '.join(run['flags'])})" for run in runs if run.get("flags")]
    if not flagged:
        return ""
    return " " + flagged_sentence(flagged)


def flagged_sentence(flagged: list[str]) -> str:
    """One sentence naming the runs whose timing `common.timing_flags` flagged."""
    return ("Timing flagged, where the machine was not quiet before or during the run (the "
            "1-minute load average still counts the run before it): " + "; ".join(flagged) + ".")


def table_and_note(table, note, results: dict) -> str:
    """A side-by-side benchmark's `table` and `note` (what it measured) of its `results`, as
    its script prints them and the pages show them above the source."""
    return table(results) + "\n\n" + note(results)
