"""Render the measured tables of README.md and docs/*.md from the records in bench/results/.

    python bench/render_results.py           # rewrite every block in place
    python bench/render_results.py --check   # exit 1, naming the blocks, when a page is out of date

A page holds a block as

    <!-- results:NAME -->
    (whatever RENDERERS[NAME] returns from the records, never edited by hand)
    <!-- /results:NAME -->

Every block ends with where its numbers come from: the command, commit, date and machine of
each record it reads. A record whose source files changed since its measurement
(`records.stale`) is rendered with a warning that names them and the command that measures
it again, so a page never shows a number silently out of date.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chess_results  # noqa: E402
from records import REPO, load_records, stale  # noqa: E402

PAGES = ("README.md", "docs")  # files, or folders of .md files, that may hold blocks
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)",
                   re.S)  # fmt: skip


# ------------------------------------------------------------------ provenance
def machine_line(record: dict) -> str:
    m = record["machine"]
    flags = ", ".join(m["flags"]) or "no AVX-512"
    where = m["gpu"] or f"{m['cpu']} ({m['cores']} cores, {flags})"
    versions = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if k in ("torch", "trl"))
    return f"{where}; {versions}"


def source(*records: dict) -> str:
    """Where the block's numbers come from, one line a record, and any staleness."""
    lines = []
    for record in records:
        dirty = " (with uncommitted changes)" if record.get("dirty") else ""
        lines.append(f"Measured by `{record['command']}` at commit {record['commit'][:7]}{dirty}, "
                     f"{record['date']}, on {machine_line(record)}.")  # fmt: skip
        changed = stale(record)
        if changed:
            shown = ", ".join(f"`{name}`" for name in changed[:6])
            more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
            lines.append(f"**Stale:** {shown}{more} changed since this measurement; the numbers "
                         f"may differ now. Measure again with the command above.")  # fmt: skip
    return "\n\n".join(lines)


def percent(x: float) -> str:
    return f"{100 * x:.1f} %"


# ------------------------------------------------------------------ the demo
def _accuracy_by_step(run: dict, key: str = "eval/greedy/accuracy") -> dict[int, float]:
    return {e["step"]: e[key] for e in run.get("checkpoint_evaluations", run["evaluations"])}


def demo_output(records: dict) -> str:
    """The end of seed 0's output: what `make demo` prints last."""
    record = records["demo"]
    run = record["results"]["runs"][0]
    return "```\n" + "\n".join(run["end_of_output"]) + "\n```\n\n" + source(record)


def demo_seeds(records: dict) -> str:
    """Held-out greedy accuracy at each evaluation, per seed, with the gain and the times."""
    record = records["demo"]
    runs = record["results"]["runs"]
    steps = sorted(_accuracy_by_step(runs[0]))
    head = ["seed", "before", *(f"step {s}" for s in steps[1:]), "gain", "training", "whole run"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        acc = _accuracy_by_step(run)
        gain = 100 * (acc[steps[-1]] - acc[steps[0]])
        rows.append("| " + " | ".join([
            str(run["seed"]), *(percent(acc[s]) for s in steps), f"{gain:+.1f} points",
            f"{run['training_seconds']:.0f} s", f"{run['wall_seconds']:.0f} s",
        ]) + " |")  # fmt: skip
    finals = [_accuracy_by_step(run)[steps[-1]] for run in runs]
    spread = f"{100 * min(finals):.1f}-{100 * max(finals):.1f} %"
    notes = (f"Final accuracy over {len(runs)} seeds: {spread}. `training` is the sum of the "
             "steps' times (sampling, reward, loss, backward, optimizer); `whole run` is the "
             "process from start to exit (loading, evaluations, checkpoints, the final save).")
    return "\n".join(rows) + "\n\n" + notes + "\n\n" + source(record)


# ------------------------------------------------------------------ against TRL
def trl_comparison(name: str, figure: str = "accuracy") -> Callable[[dict], str]:
    """A `bench/time_to_accuracy.py` record: both libraries' medians and the time ratio;
    `figure` names what the record's "accuracy" holds (chess: the held-out greedy reward,
    shown with three decimals rather than as a percentage)."""
    shown = percent if figure == "accuracy" else (lambda x: f"{x:.3f}")
    each = (lambda x: f"{100 * x:.1f}") if figure == "accuracy" else (lambda x: f"{x:.3f}")

    def render(records: dict) -> str:
        record = records[name]
        summary = record["results"]["summary"]
        rows = [f"| library | steps | s/step | training time | final held-out {figure}, median "
                f"(per seed) | time to TRL's final {figure} | peak RSS |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for lib in ("grpo", "trl"):
            s = summary[lib]
            finals = ", ".join(each(a) for a in s["finals"])
            reach = s.get("time_to_trl_final")
            reach = "never" if reach in (None, float("inf")) else f"{reach:.0f} s"
            label = "grpo" if lib == "grpo" else "TRL"
            rows.append(f"| {label} | {s['steps']} | {s['seconds_per_step']:.3f} s | "
                        f"{s['seconds']:.0f} s | {shown(s['final_accuracy'])} ({finals}) | "
                        f"{reach} | {s['peak_rss_gib']:.2f} GiB |")  # fmt: skip
        ratio = summary.get("ratio_to_trl_run")
        grpo, trl = summary["grpo"], summary["trl"]
        text = [f"A grpo step takes {grpo['seconds_per_step'] / trl['seconds_per_step']:.2f}x a TRL "
                f"step, at {grpo['peak_rss_gib'] / trl['peak_rss_gib']:.2f}x its peak memory."]
        if ratio is None:
            text.append("TRL ended no higher than it started, so there is no time to its final "
                        f"{figure} to compare.")  # fmt: skip
        else:
            text.append(f"grpo reaches TRL's final {figure} in {ratio:.2f}x TRL's whole training "
                        "time.")  # fmt: skip
        flagged = [f for lib in ("grpo", "trl") for f in summary[lib].get("flagged", [])]
        if flagged:
            text.append("Runs whose timing shared the machine: " + "; ".join(flagged) + ".")
        return "\n".join(rows) + "\n\n" + " ".join(text) + "\n\n" + source(record)

    return render


RENDERERS: dict[str, Callable[[dict], str]] = {
    "demo-output": demo_output,
    "demo-seeds": demo_seeds,
    "demo-vs-trl": trl_comparison("demo_vs_trl"),
    **{f"chess-{name}": functools.partial(render, source=source)
       for name, render in chess_results.RENDERERS.items()},
    "chess-vs-trl": trl_comparison("chess_vs_trl", "reward"),
}


# ------------------------------------------------------------------ pages
def pages() -> list[Path]:
    found = []
    for name in PAGES:
        path = REPO / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return found


def render_page(text: str, records: dict) -> str:
    """`text` with every block rendered from `records`; an unknown block name is an error."""

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise KeyError(f"block {name!r}: no renderer; known: {sorted(RENDERERS)}")
        return f"{match[1]}{RENDERERS[name](records).rstrip()}\n{match[4]}"

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    records, differ = load_records(), []
    for page in pages():
        text = page.read_text()
        rendered = render_page(text, records)
        if rendered != text:
            differ.append(page.relative_to(REPO).as_posix())
            if not args.check:
                page.write_text(rendered)
    verb = "out of date" if args.check else "rendered"
    print(f"{verb}: {', '.join(differ)}" if differ else "every block is up to date")
    return 1 if differ and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
