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
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chess_results  # noqa: E402
import decode_results  # noqa: E402
import environment_pairs  # noqa: E402
import gpu_results  # noqa: E402
import loss_phase  # noqa: E402
import output_layer_precision  # noqa: E402
import roofline_results  # noqa: E402
import step_before_after  # noqa: E402
import word_problem_results  # noqa: E402
import word_problem_seeds  # noqa: E402
from provenance import (  # noqa: E402
    flagged_sentence,
    percent,
    source,
    stamped_runs,
    table_and_note,
    timing_note,
    when_where,
)
from records import REPO, load_records, stale  # noqa: E402

PAGES = ("README.md", "docs")  # files, or folders of .md files, that may hold blocks
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)",
                   re.S)  # fmt: skip


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
    notes += timing_note(runs)
    return "\n".join(rows) + "\n\n" + notes + "\n\n" + source(record)


def demo_cpus(records: dict) -> str:
    """The demo's held-out accuracy before and after training on each CPU that trained it
    (records of `bench/train_seeds.py` on configs/demo.yaml as shipped, each run on the CPU
    stamped on it): seed 0's, what `make demo` prints, and every seed's."""
    names = [name for name, record in records.items()
             if record["command"].startswith("python bench/train_seeds.py ")
             and record["results"]["config"] == "configs/demo.yaml"
             and not record["results"]["overrides"]]  # fmt: skip
    # read by name, so that the pages' test sees which records the block shows
    measured = sorted((records[name] for name in names), key=lambda record: record["date"])
    if not measured:
        return ("No record of the demo yet: `python bench/train_seeds.py configs/demo.yaml "
                "--name demo --seeds 0 1 2` measures one.")
    by_cpu: dict[str, list[dict]] = {}
    for record in measured:
        for run in stamped_runs(record):
            machine = run["machine"]
            by_cpu.setdefault(f"{machine['cpu']} ({', '.join(machine['flags'])})", []).append(run)
    rows = ["| CPU | before | after, seed 0 | after, every seed |", "|---|---|---|---|"]
    for cpu, runs in by_cpu.items():
        runs.sort(key=lambda run: run["seed"])
        accuracy = [_accuracy_by_step(run) for run in runs]
        before = ", ".join(dict.fromkeys(percent(acc[min(acc)]) for acc in accuracy))
        after = {run["seed"]: acc[max(acc)] for run, acc in zip(runs, accuracy, strict=True)}
        every = ", ".join(f"{100 * value:.1f}" for value in after.values())
        seed_0 = percent(after[0]) if 0 in after else "-"
        rows.append(f"| {cpu} | {before} | {seed_0} | {every} % |")
    return "\n".join(rows) + "\n\n" + source(*measured)


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
        ratio = summary["ratio_to_trl_run"]  # None: TRL ended no higher than it started
        rows = [f"| library | steps | s/step | training time | final held-out {figure}, median "
                f"(per seed) | time to TRL's final {figure} | peak RSS |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for lib in ("grpo", "trl"):
            s = summary[lib]
            finals = ", ".join(each(a) for a in s["finals"])
            reach = s["time_to_trl_final"]
            reach = "-" if ratio is None else "never" if reach == float("inf") else f"{reach:.0f} s"
            label = "grpo" if lib == "grpo" else "TRL"
            rows.append(f"| {label} | {s['steps']} | {s['seconds_per_step']:.3f} s | "
                        f"{s['seconds']:.0f} s | {shown(s['final_accuracy'])} ({finals}) | "
                        f"{reach} | {s['peak_rss_gib']:.2f} GiB |")  # fmt: skip
        grpo, trl = summary["grpo"], summary["trl"]
        text = [f"A grpo step takes {grpo['seconds_per_step'] / trl['seconds_per_step']:.2f}x a TRL "
                f"step, at {grpo['peak_rss_gib'] / trl['peak_rss_gib']:.2f}x its peak memory."]
        if ratio is None:
            text.append(f"TRL ended no higher than it started ({shown(summary['trl_start'])}), so "
                        f"there is no time to its final {figure} to compare.")  # fmt: skip
        else:
            text.append(f"grpo reaches TRL's final {figure} in {ratio:.2f}x TRL's whole training "
                        "time.")  # fmt: skip
        at = {lib: " / ".join(shown(a) for a in s["accuracy_at"].values())
              for lib, s in (("grpo", grpo), ("TRL", trl))}  # fmt: skip
        text.append(f"After a quarter, half and all of TRL's {trl['seconds']:.0f} s of "
                    f"training: grpo {at['grpo']}, TRL {at['TRL']}.")  # fmt: skip
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
    ratio = s["ratio_to_trl_run"]  # None: TRL ended no higher than it started
    if ratio is None:
        grpo_at, trl_at = (s[lib]["accuracy_at"]["1"] for lib in ("grpo", "trl"))
        reach = ("TRL ended no higher than it started; after TRL's training time grpo's figure "
                 f"is {grpo_at:.3g}, TRL's {trl_at:.3g}")  # fmt: skip
    else:
        reach = f"grpo reaches TRL's final figure in {ratio:.2f}x TRL's training time"
    steps = f"grpo {s['grpo']['steps']} steps, TRL {s['trl']['steps']}"
    return f"{steps}: a grpo step takes {step:.2f}x a TRL step; {reach}"


SUMMARY = [  # (what, record, how its figure is read, the page that explains it)
    ("`make demo`: held-out greedy accuracy", "demo",
     lambda r: _before_after(r, "eval/greedy/accuracy", percent), "docs/demo.md"),
    ("the demo against TRL 1.16, same hyper-parameters", "demo_vs_trl", _vs_trl,
     "docs/results.md"),
    ("SmolLM2-135M-Instruct, word problems (`configs/smollm2_math.yaml`): held-out greedy "
     "accuracy", "smollm2_math", word_problem_seeds.summary, "docs/word_problems.md"),
    ("the same, trained on three prompt forms (`configs/smollm2_math_forms.yaml`)",
     "smollm2_math_forms", word_problem_seeds.summary,
     "docs/word_problems.md#training-on-several-prompt-forms"),
    ("Gemma 3 270M, a base model, word problems (`configs/gemma3_math.yaml`)", "gemma3_math",
     word_problem_seeds.summary, "docs/real_model.md#training-it"),
    ("SmolLM2 word problems against TRL 1.16", "smollm2_vs_trl", _vs_trl, "docs/results.md"),
    ("Gemma 3 word problems against TRL 1.16", "gemma3_vs_trl", _vs_trl,
     "docs/performance.md#comparing-with-trl"),
    ("the chess-move model: held-out greedy reward", "chess",
     lambda r: _before_after(r, "eval/greedy/reward_mean", lambda x: f"{x:.3f}"), "docs/chess.md"),
    ("`bench/gpu_check.py` on a GPU", "gpu_check", gpu_results.gpu_summary, "docs/gpu.md"),
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
        where = when_where(record)
        rows.append(f"| {what} | {figure(record)}{stale_mark} | {where} | [{page}]({page}) |")
    return "\n".join(rows) + ("\n\nEach row's command is on its page; **stale** marks a record "
                              "whose source files changed since it was measured.")


def _table_and_note(records: dict, module, name: str) -> str:
    """A side-by-side benchmark's table, what it measured and its source: bench/loss_phase.py's,
    bench/output_layer_precision.py's."""
    results = records[name]["results"]
    return table_and_note(module.table, module.note, results) + "\n\n" + source(records[name])


def step_change(records: dict) -> str:
    """bench/step_before_after.py's phases at two commits, then the word-problem config's
    held-out accuracy (3 seeds) measured at the after commit's code."""
    step, seeds = records["step_before_after"], records["smollm2_math"]
    accuracy = (f"`configs/smollm2_math.yaml` after the change, held-out greedy accuracy: "
                f"{word_problem_seeds.summary(seeds)}; median step "
                f"{statistics.median(r['median_step_seconds'] for r in seeds['results']['runs']):.1f} s "
                "(the median of the seeds' medians; per seed in word_problems.md).")  # fmt: skip
    return (table_and_note(step_before_after.table, step_before_after.note, step["results"])
            + "\n\n" + accuracy + "\n\n" + source(step, seeds))


def step_change_avx2(records: dict) -> str:
    """The same two commits' step on a CPU without bfloat16 instructions, where
    `policy.precision: auto` trains in float32 at both."""
    record = records["step_before_after_avx2"]
    flags = ", ".join(record["machine"]["flags"])
    peaks = [p for side in record["results"]["peaks_bf16_gflops"].values() for p in side]
    return (table_and_note(step_before_after.table, step_before_after.note, record["results"])
            + f"\n\nThis CPU's flags: {flags}. Without bfloat16 instructions torch emulates "
            f"bfloat16 products ({min(peaks):.2f}-{max(peaks):.2f} GFLOP/s in these runs), so "
            "`policy.precision: auto`, the config's setting at both commits, trains in float32 "
            "there.\n\n" + source(record))


RENDERERS: dict[str, Callable[[dict], str]] = {
    "demo-output": demo_output,
    "demo-seeds": demo_seeds,
    "demo-cpus": demo_cpus,
    "demo-vs-trl": trl_comparison("demo_vs_trl"),
    "smollm2-math": functools.partial(word_problem_seeds.render, name="smollm2_math",
                                      source=source, timing_note=timing_note),
    "smollm2-math-forms": functools.partial(word_problem_seeds.render, name="smollm2_math_forms",
                                            source=source, timing_note=timing_note),
    "gemma3-math": functools.partial(word_problem_seeds.render, name="gemma3_math",
                                     source=source, timing_note=timing_note),
    "lean-gemma": functools.partial(decode_results.lean_gemma, source=source),
    "llamacpp-decode": functools.partial(decode_results.llamacpp, source=source),
    "llamacpp-decode-avx2": functools.partial(
        decode_results.llamacpp, source=source, name="llamacpp_decode_avx2"
    ),
    "smollm2-vs-trl": trl_comparison("smollm2_vs_trl"),
    "gemma3-vs-trl": trl_comparison("gemma3_vs_trl"),
    "word-problem-diagnosis": functools.partial(word_problem_results.render, source=source),
    "gpu-check": functools.partial(gpu_results.gpu_check, source=source),
    "roofline": functools.partial(roofline_results.render, source=source),
    "roofline-gemma": functools.partial(
        roofline_results.render, source=source, name="roofline_gemma"
    ),
    "roofline-float32": functools.partial(
        roofline_results.render, source=source, name="roofline_float32"
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
    **{
        block: functools.partial(_table_and_note, module=loss_phase, name=name)
        for block, name in (
            ("loss-precision", "loss_precision"),
            ("loss-precision-gemma", "loss_precision_gemma"),
            ("loss-packing", "loss_packing"),
            ("loss-packing-gemma", "loss_packing_gemma"),
        )
    },
    "step-before-after": step_change,
    "step-before-after-avx2": step_change_avx2,
    "huge-pages": functools.partial(
        _table_and_note, module=environment_pairs, name="huge_pages_float32"
    ),
    "output-layer-precision": functools.partial(
        _table_and_note, module=output_layer_precision, name="output_layer_precision"
    ),
    **{f"chess-{name}": functools.partial(render, source=source)
       for name, render in chess_results.RENDERERS.items()},
    "chess-vs-trl": trl_comparison("chess_vs_trl", "reward"),
    "features": functools.partial(gpu_results.features, source=source),
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
