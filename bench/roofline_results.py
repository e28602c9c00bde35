"""The roofline tables of `bench/roofline.py` records, printed by the script and rendered into
docs/performance.md (`bench/render_results.py`): one record's phases against this machine's
limit (`table`, `render`), and several records side by side, phase by phase (`compare`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["PHASES", "compare", "render", "runs_table", "table"]

PHASES = {  # the step's phases measured, in the order they run, as docs/metrics.md names their times
    "sampling": "sampling (decoding)",
    "old_logprobs": "old log-probs",
    "loss_backward": "loss forward + backward",
    "optimizer": "optimizer (clip + AdamW)",
}
GIB = 2**30


def _g(x: float | None, scale: float = 1.0) -> str:
    """Three significant figures; "-" for what is not counted."""
    return "-" if x is None else f"{x / scale:.3g}"


def _gib(nbytes: float | None) -> str:
    """Bytes as GiB with two decimals; "-" for what was not measured (an older record)."""
    return "-" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def _n(count: float, noun: str) -> str:
    """A count and its noun; a mean over steps to one decimal (29.3 rows)."""
    return f"{round(count, 1):g} {noun}{'' if count == 1 else 's'}"


def multiplied_in(results: dict) -> list[str]:
    """The dtypes the run's phases multiply in that it measured a peak for, sorted."""
    return sorted({r.get("dtype") for r in results["phases"]} & results["peaks"]["matmul"].keys())


def table(results: dict) -> str:
    """The phases as a markdown table, then the peaks and the batch they were measured on."""
    lines = ["| phase | multiplies in | GFLOP/step | GB/step | compute limit s | memory limit s "
             "| limit s | measured s/step | x of the limit | peak RSS |", "|" + "---|" * 10]  # fmt: skip
    for r in results["phases"]:
        cells = ["", "", "", "", ""]  # the total: its limit is the phases' limits summed
        if r["phase"] != "total":
            compute = r["compute_s"] if r["flops"] is not None else None
            cells = [r["dtype"] or "-", _g(r["flops"], 1e9), _g(r["bytes"], 1e9), _g(compute),
                     _g(r["memory_s"])]  # fmt: skip
        lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {_g(r['limit_s'])} | "
                     f"{_g(r['seconds'])} | {r['x_of_limit']:.1f} | "
                     f"{_gib(r.get('peak_rss_bytes'))} |")  # fmt: skip
    peaks, tokens, model = results["peaks"], results["tokens_per_step"], results["model"]
    gemm = ", ".join(f"{d} {p['flops_per_s'] / 1e9:.1f} GFLOP/s"
                     for d, p in peaks["matmul"].items())  # fmt: skip
    m, k, n = next(iter(peaks["matmul"].values()))["shape"]
    memory = peaks["memory"]
    sets = "".join(f" --set {s}" for s in results["overrides"])
    ranges = []
    for dtype in multiplied_in(results):
        rates = peaks["matmul_rates"][dtype]
        ranges.append(f"The {dtype} product measured between {min(rates) / 1e9:.0f} and "
                      f"{max(rates) / 1e9:.0f} GFLOP/s over the run.")  # fmt: skip
    notes = [
        f"Peaks measured in the same process at {_n(peaks['threads'], 'thread')}, the fastest "
        f"of {peaks['samples']} measurements (before the steps and after each): a ({m}, {k}) "
        f"@ ({k}, {n}) matrix product (the model's MLP shape), {gemm}; memory "
        f"{memory['bytes_per_s'] / 1e9:.1f} GB/s (a {memory['mib']} MiB copy "
        f"{memory['copy_bytes_per_s'] / 1e9:.1f}, a sum {memory['sum_bytes_per_s'] / 1e9:.1f})."
        + "".join(f" {sentence}" for sentence in ranges),
        f"Means over {_n(results['steps'], 'step')} after {results['warmup_steps']} untimed of "
        f"`{results['config']}{sets}` ({model['model_type']}, {model['matmul_params'] / 1e6:.0f}M "
        f"weights in matrix products); per step {_n(tokens['sampled_groups'], 'prompt')} of "
        f"{tokens['prompt_tokens_mean']:.0f} tokens on average, "
        f"{_n(tokens['completions'], 'completion')} of {tokens['completion_tokens_mean']:.1f}, "
        f"{_n(tokens['loss_rows'], 'row')} scored with gradients.",
        "A limit is the larger of the phase's FLOPs at the peak rate of its dtype and its bytes "
        "at the peak bandwidth (`bench/roofline_counts.py`); x of the limit is the measured "
        "time over it.",
    ]
    if any(r.get("peak_rss_bytes") is not None for r in results["phases"]):
        notes.append("Peak RSS is the process's largest resident memory while the phase ran, "
                     "in any measured step (`bench/roofline_memory.py`).")  # fmt: skip
    if results.get("flags"):
        notes.append(
            "Timing flagged, the machine was not quiet: " + "; ".join(results["flags"]) + "."
        )
    return "\n".join(lines) + "\n\n" + " ".join(notes)


def render(records: dict, source: Callable[..., str], name: str = "roofline") -> str:
    """A block of docs/performance.md: record `name`'s table and where it comes from."""
    record = records[name]
    return table(record["results"]) + "\n\n" + source(record)


# ------------------------------------------------------------------ side by side
def _phase_rows(runs: Sequence[tuple[str, dict]]) -> list[str]:
    """Per phase any run has, in the order they run and the phases together last, one row a
    run: its time, limit, ratio and peak RSS; a phase a run never ran (its old log-probs
    skipped) says so."""
    names = {r["phase"]: r["name"] for _, results in runs for r in results["phases"]}
    order = [(p, names[p]) for p in [*PHASES, "total"] if p in names]
    lines = ["| phase | run | measured s/step | limit s | x of the limit | peak RSS |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for phase, name in order:
        for i, (label, results) in enumerate(runs):
            shown = name if i == 0 else ""
            row = next((r for r in results["phases"] if r["phase"] == phase), None)
            if row is None:
                lines.append(f"| {shown} | {label} | did not run | | | |")
                continue
            lines.append(f"| {shown} | {label} | {_g(row['seconds'])} | {_g(row['limit_s'])} | "
                         f"{row['x_of_limit']:.1f} | {_gib(row.get('peak_rss_bytes'))} |")  # fmt: skip
    return lines


def runs_table(runs: Sequence[tuple[str, dict]]) -> list[str]:
    """What each run is: its model, what trains, the state that costs, the tokens of a step."""
    lines = ["| run | model | weights in matrix products | trainable parameters | optimizer "
             "state | resident after warm-up | prompts x tokens | completions x tokens | rows "
             "with gradients |", "|" + "---|" * 9]  # fmt: skip
    for label, results in runs:
        model, tokens = results["model"], results["tokens_per_step"]
        frozen = ", ".join(f"`{f}`" for f in model.get("frozen") or []) or "nothing"
        lines.append(
            f"| {label} | {model['model_type']} | {model['matmul_params'] / 1e6:.1f}M | "
            f"{model['trainable_params'] / 1e6:.1f}M (frozen: {frozen}) | "
            f"{_gib(model.get('optimizer_state_bytes'))} | "
            f"{_gib(results.get('rss_after_warmup_bytes'))} | "
            f"{tokens['sampled_groups']:g} x {tokens['prompt_tokens_mean']:.1f} | "
            f"{tokens['completions']:g} x {tokens['completion_tokens_mean']:.1f} | "
            f"{round(tokens['loss_rows'], 1):g} |"
        )
    return lines


def _batch(results: dict) -> str:
    b = results.get("batch")
    if b is None:  # an older record
        return "unrecorded"
    return f"{b['prompts']} x {b['group_size']} x {b['max_new_tokens']}"


PEAK_SPREAD = 1.2
"""Runs whose measured matrix-product peaks differ by more than this factor ran on a machine
of different speed: their seconds do not compare, their x of the limit still do."""


def unequal_peaks(shown: Sequence[tuple[str, dict]]) -> list[str]:
    """A sentence for each dtype all the runs multiply in whose matrix-product peaks, measured
    in each run's own process, differ by more than `PEAK_SPREAD` (a busy or throttled
    machine), else none (also where fewer than two runs measured them)."""
    measured = [(label, results) for label, results in shown if "peaks" in results]
    if len(measured) < 2:
        return []
    common = set.intersection(*(set(multiplied_in(results)) for _, results in measured))
    sentences = []
    for dtype in sorted(common):
        rates = {label: results["peaks"]["matmul"][dtype]["flops_per_s"] / 1e9
                 for label, results in measured}  # fmt: skip
        if max(rates.values()) <= PEAK_SPREAD * min(rates.values()):
            continue
        listed = ", ".join(f"{label} {rate:.0f}" for label, rate in rates.items())
        sentences.append(f"The runs measured different {dtype} matrix-product peaks ({listed} "
                         "GFLOP/s): the machine was slower during one of them, so their "
                         "seconds do not compare; each x of the limit is against its own "
                         "run's peak.")  # fmt: skip
    return sentences


def compare(records: dict, source: Callable[..., str], runs: Sequence[tuple[str, str]]) -> str:
    """A block of docs/performance.md: the records `runs` names ((record, label) pairs) side by
    side, phase by phase, then what each run is, then where each record comes from."""
    shown = [(label, records[name]["results"]) for name, label in runs]
    batches = {label: _batch(results) for label, results in shown}
    if len(set(batches.values())) == 1:
        same = f"Every run samples B x G x T = {next(iter(batches.values()))} per step"
    else:
        same = "B x G x T differ: " + ", ".join(f"{label} {b}" for label, b in batches.items())
    notes = [
        f"{same} (prompts x group size x most new tokens); the tokens each model drew are in "
        "the second table. Means per step; peak RSS is the largest of any measured step.",
        "Optimizer state is what AdamW held after the warm-up (both moments of every "
        "trainable parameter); resident memory is the process's at the same point.",
    ]
    flagged = [f"{label} ({'; '.join(results['flags'])})" for label, results in shown
               if results.get("flags")]  # fmt: skip
    if flagged:
        notes.append("Timing flagged, the machine was not quiet: " + "; ".join(flagged) + ".")
    notes += unequal_peaks(shown)
    body = "\n".join(_phase_rows(shown)) + "\n\n" + "\n".join(runs_table(shown))
    sources = source(*(records[name] for name, _ in runs))
    return body + "\n\n" + " ".join(notes) + "\n\n" + sources
