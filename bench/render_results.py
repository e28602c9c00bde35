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
it again, so a page never shows a number silently out of date. A block whose record does not
exist yet says so, naming the record, instead of showing a number.
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
import decode_results  # noqa: E402
import roofline_results  # noqa: E402
import word_problem_results  # noqa: E402
import word_problem_seeds  # noqa: E402
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


def _added(record: dict) -> str:
    """For a record whose seeds were measured in several invocations (`train_seeds.py
    --add-to`, each refused unless the files were unchanged): which seed ran when."""
    runs = (record.get("results") or {}).get("runs") or []
    if not any(isinstance(run, dict) and "commit" in run for run in runs):
        return ""
    when: dict[tuple[str, str, str], list[str]] = {}
    for run in runs:
        cpu = run.get("machine", record["machine"])["cpu"]
        key = (run.get("commit", record["commit"])[:7], run.get("date", record["date"]), cpu)
        when.setdefault(key, []).append(str(run["seed"]))
    several = len({cpu for _, _, cpu in when}) > 1
    parts = [f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} at commit {commit}, {date}"
             + (f", on {cpu}" if several else "") for (commit, date, cpu), seeds in when.items()]
    return (" The seeds were measured in turn, on the same files: " + "; ".join(parts) + ".")


def _checked(check: dict) -> str:
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
                     f"{record['date']}, on {machine_line(record)}.{_added(record)}")  # fmt: skip
        for check in record.get("verified", []):
            lines.append(_checked(check))
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
    notes += timing_note(runs)
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
        flagged = [f"{name} {f}" for lib, name in (("grpo", "grpo"), ("trl", "TRL"))
                   for f in summary[lib].get("flagged", [])]  # fmt: skip
        if flagged:
            text.append(flagged_sentence(flagged))
        return "\n".join(rows) + "\n\n" + " ".join(text) + "\n\n" + source(record)

    return render


# ------------------------------------------------------------------ samplers
# ------------------------------------------------------------------ the README's summary
def _before_after(record: dict, key: str, shown: Callable[[float], str]) -> str:
    """The start and each seed's end of a `train_seeds.py` record (the starts' range where
    seeds measured on different CPUs start apart)."""
    ends = [chess_results._ends(run) for run in record["results"]["runs"]]  # (first, last) each

    def span(values: list[float]) -> str:
        low, high = min(values), max(values)
        return shown(low) if shown(low) == shown(high) else f"{shown(low)} to {shown(high)}"

    seeds = "1 seed" if len(ends) == 1 else f"{len(ends)} seeds"
    starts, finals = [first[key] for first, _ in ends], [last[key] for _, last in ends]
    return f"{span(starts)} -> {span(finals)} ({seeds}, {ends[0][1]['step']} steps)"


def _vs_trl(record: dict) -> str:
    s = record["results"]["summary"]
    step = s["grpo"]["seconds_per_step"] / s["trl"]["seconds_per_step"]
    ratio = s.get("ratio_to_trl_run")
    reach = ("TRL ended no higher than it started" if ratio is None else
             f"grpo reaches TRL's final figure in {ratio:.2f}x TRL's training time")  # fmt: skip
    return f"a grpo step takes {step:.2f}x a TRL step; {reach}"


def _gpu_summary(record: dict) -> str:
    parts = record["results"]["parts"].values()
    counts = {k: sum(p["status"] == k for p in parts) for k in ("ok", "failed", "skipped")}
    return f"{counts['ok']} parts ran, {counts['failed']} failed, {counts['skipped']} skipped"


SUMMARY = [  # (what, record, how its figure is read, the page that explains it)
    ("`make demo`: held-out greedy accuracy", "demo",
     lambda r: _before_after(r, "eval/greedy/accuracy", percent), "docs/demo.md"),
    ("the demo against TRL 1.16, same settings", "demo_vs_trl", _vs_trl, "docs/results.md"),
    ("SmolLM2-135M-Instruct, word problems: held-out greedy accuracy, all splits", "smollm2_math",
     lambda r: _before_after(r, "eval/greedy/accuracy", percent), "docs/word_problems.md"),
    ("word problems against TRL 1.16", "smollm2_vs_trl", _vs_trl, "docs/results.md"),
    ("the chess-move model: held-out greedy reward", "chess",
     lambda r: _before_after(r, "eval/greedy/reward_mean", lambda x: f"{x:.3f}")
     + f"; the chess loop's own run: {chess_results.SEED_001_START} -> {chess_results.SEED_001_END}",
     "docs/chess.md"),
    ("`bench/gpu_check.py` on a GPU", "gpu_check", _gpu_summary, "docs/gpu.md"),
]  # fmt: skip


def summary(records: dict) -> str:
    """One row a headline record: its figure, or that it has not been measured yet."""
    rows = ["| result | measured | when, where | more |", "|---|---|---|---|"]
    for what, name, figure, page in SUMMARY:
        record = records.get(name)
        if record is None:
            rows.append(f"| {what} | not measured yet | - | [{page}]({page}) |")
            continue
        stale_mark = " (**stale**)" if stale(record) else ""
        where = f"{record['date'][:10]}, {machine_line(record)}, commit {record['commit'][:7]}"
        rows.append(f"| {what} | {figure(record)}{stale_mark} | {where} | [{page}]({page}) |")
    return "\n".join(rows) + ("\n\nEach row's command is on its page; **stale** marks a record "
                              "whose source files changed since it was measured.")


# ------------------------------------------------------------------ the GPU check
def gpu_check(records: dict) -> str:
    """Every part of `bench/gpu_check.py`'s record: its status, speed, memory and notes."""
    record = records["gpu_check"]
    report = record["results"]
    rows = ["| part | status | s/step | completion tokens/s | peak GPU memory | notes |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for name, part in report["parts"].items():
        cells = [f"{part[k]:.3g}" if isinstance(part.get(k), float) else "-"
                 for k in ("s_per_step", "tokens_per_s")]  # fmt: skip
        peak = f"{part['peak_gib']:.2f} GiB" if isinstance(part.get("peak_gib"), float) else "-"
        notes = (part.get("reason") or part.get("summary") or "").replace("|", "/")
        rows.append(f"| `{name}` | {part['status']} | {cells[0]} | {cells[1]} | {peak} | {notes} |")
    counts = {k: sum(p["status"] == k for p in report["parts"].values())
              for k in ("ok", "failed", "skipped")}  # fmt: skip
    text = (f"On {report['device']} with torch {report['torch']}: {counts['ok']} parts ok, "
            f"{counts['failed']} failed, {counts['skipped']} skipped.")  # fmt: skip
    return text + "\n\n" + "\n".join(rows) + "\n\n" + source(record)


FEATURES = [  # (feature, what `make test` shows on a CPU, the GPU check's parts that run it)
    ("GRPO, Dr. GRPO, DAPO, GSPO, CISPO and REINFORCE losses; k1, k2, k3 KL estimators",
     "hand-computed values; exact gradients on enumerable policies", ["step/demo/float32"]),
    ("any transformers causal LM: full fine-tuning, frozen reference, chat templates",
     "tiny Llama, Qwen2, Qwen3 and Mistral models built in the tests",
     ["step/smollm2-135m/float32", "step/smollm2-135m/bfloat16", "exact/scoring"]),
    ("LoRA adapters", "the reference is the adapter-free base; merged saves",
     ["step/smollm2-135m/lora-bf16-mixed"]),
    ("bf16 mixed precision (`policy.precision`)", "updates equal to float32's within rounding",
     ["step/demo/bf16-mixed", "step/smollm2-135m/bf16-mixed"]),
    ("`grpo train`: evaluation, checkpoints, the final model", "every file of a run directory",
     ["train/demo"]),
    ("resume after a crash, at the uninterrupted run's parameters", "kill -9, then --resume", []),
    ("overlapped rollouts (`run.max_staleness`)", "staleness bound, no group lost or repeated",
     ["train/demo-overlap"]),
    ("FSDP2", "2 processes (gloo) reach one process's parameters",
     ["step/demo/fsdp2-float32", "step/smollm2-135m/fsdp2-float32"]),
    ("data parallel (DDP) over `torchrun`, NCCL on several GPUs",
     "2 processes (gloo) reach one process's parameters", []),
    ("vLLM in-process, sharing the trainer's weights", "vLLM's CPU build (`make test-vllm`)",
     ["vllm/shared-engine", "vllm/copy-sleep-wake", "vllm/lora-merged-copy"]),
    ("vLLM servers (`vllm serve`)", "one CPU-build server (`make test-vllm`)", []),
    ("multi-turn environments, reward parsers, code sandbox; masked fill-in models",
     "yes (the CPU is where they run)", []),
]  # fmt: skip


def _gpu_cell(report: dict | None, parts: list[str]) -> str:
    """What the GPU check says of these parts: ran, failed, or not yet run (and why)."""
    found = [report["parts"][p] for p in parts if report and p in report["parts"]]
    if not found:
        return "not yet run"
    statuses = {part["status"] for part in found}
    if statuses == {"ok"}:
        return f"ran on an {report['device']}"
    if "failed" in statuses:
        failed = [p for p in parts if report["parts"].get(p, {}).get("status") == "failed"]
        return "**failed** on an " + report["device"] + ": " + ", ".join(f"`{p}`" for p in failed)
    if statuses == {"skipped"}:
        return f"not yet run ({found[0]['reason']})"
    ran = [p for p in parts if report["parts"].get(p, {}).get("status") == "ok"]
    return f"partly: {', '.join(f'`{p}`' for p in ran)} ran on an {report['device']}"


def features(records: dict) -> str:
    """What works, what `make test` checks on a CPU, and what the GPU check found."""
    report = records["gpu_check"]["results"] if "gpu_check" in records else None
    rows = ["| feature | tested on a CPU (`make test`) | on a GPU (`bench/gpu_check.py`) |",
            "|---|---|---|"]  # fmt: skip
    rows += [f"| {name} | {cpu} | {_gpu_cell(report, parts)} |" for name, cpu, parts in FEATURES]
    tail = source(records["gpu_check"]) if report else "No GPU check has run yet."
    return "\n".join(rows) + "\n\n" + tail


RENDERERS: dict[str, Callable[[dict], str]] = {
    "demo-output": demo_output,
    "demo-seeds": demo_seeds,
    "demo-vs-trl": trl_comparison("demo_vs_trl"),
    "smollm2-math": functools.partial(word_problem_seeds.render, name="smollm2_math",
                                      source=source, timing_note=timing_note),
    "smollm2-math-forms": functools.partial(word_problem_seeds.render, name="smollm2_math_forms",
                                            source=source, timing_note=timing_note),
    "lean-gemma": functools.partial(decode_results.lean_gemma, source=source),
    "llamacpp-decode": functools.partial(decode_results.llamacpp, source=source),
    "smollm2-vs-trl": trl_comparison("smollm2_vs_trl"),
    "word-problem-diagnosis": functools.partial(word_problem_results.render, source=source),
    "gpu-check": gpu_check,
    "roofline": functools.partial(roofline_results.render, source=source),
    "roofline-gemma": functools.partial(
        roofline_results.render, source=source, name="roofline_gemma"
    ),
    "roofline-models": functools.partial(
        roofline_results.compare,
        source=source,
        runs=(("roofline", "SmolLM2-135M"), ("roofline_gemma", "Gemma 3 270M")),
    ),
    "roofline-freeze": functools.partial(
        roofline_results.compare,
        source=source,
        runs=(
            ("roofline_gemma", "embedding frozen"),
            ("roofline_gemma_unfrozen", "embedding trained"),
        ),
    ),
    **{f"chess-{name}": functools.partial(render, source=source)
       for name, render in chess_results.RENDERERS.items()},
    "chess-vs-trl": trl_comparison("chess_vs_trl", "reward"),
    "features": features,
    "summary": summary,
}


# ------------------------------------------------------------------ pages
def pages() -> list[Path]:
    found = []
    for name in PAGES:
        path = REPO / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return found


class MissingRecord(KeyError):
    """A block reads a record that bench/results/ does not hold."""


class Records(dict):
    """The records by name; reading an absent one raises `MissingRecord`."""

    def __missing__(self, name: str) -> dict:
        raise MissingRecord(name)


def render_block(name: str, records: dict) -> str:
    """Block `name` rendered from `records`, or a line saying which record is not measured yet."""
    try:
        return RENDERERS[name](Records(records)).rstrip()
    except MissingRecord as missing:
        return (f"*Not measured yet: this table is rendered from the record "
                f"`bench/results/{missing.args[0]}.json`, which does not exist yet.*")


def render_page(text: str, records: dict) -> str:
    """`text` with every block rendered from `records`; an unknown block name is an error."""

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise KeyError(f"block {name!r}: no renderer; known: {sorted(RENDERERS)}")
        return f"{match[1]}{render_block(name, records)}\n{match[4]}"

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
