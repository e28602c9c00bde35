"""The roofline table of a `bench/roofline.py` record, printed by the script and rendered into
docs/performance.md (the `roofline` block of `bench/render_results.py`)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["render", "table"]


def _g(x: float | None, scale: float = 1.0) -> str:
    """Three significant figures; "-" for what is not counted."""
    return "-" if x is None else f"{x / scale:.3g}"


def _n(count: float, noun: str) -> str:
    return f"{count:g} {noun}{'' if count == 1 else 's'}"


def table(results: dict) -> str:
    """The phases as a markdown table, then the peaks and the batch they were measured on."""
    lines = ["| phase | multiplies in | GFLOP/step | GB/step | compute limit s | memory limit s "
             "| limit s | measured s/step | x of the limit |", "|" + "---|" * 9]  # fmt: skip
    for r in results["phases"]:
        cells = ["", "", "", "", ""]  # the total: its limit is the phases' limits summed
        if r["phase"] != "total":
            compute = r["compute_s"] if r["flops"] is not None else None
            cells = [r["dtype"] or "-", _g(r["flops"], 1e9), _g(r["bytes"], 1e9), _g(compute),
                     _g(r["memory_s"])]  # fmt: skip
        lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {_g(r['limit_s'])} | "
                     f"{_g(r['seconds'])} | {r['x_of_limit']:.1f} |")  # fmt: skip
    peaks, tokens, model = results["peaks"], results["tokens_per_step"], results["model"]
    gemm = ", ".join(f"{d} {p['flops_per_s'] / 1e9:.1f} GFLOP/s"
                     for d, p in peaks["matmul"].items())  # fmt: skip
    m, k, n = next(iter(peaks["matmul"].values()))["shape"]
    memory = peaks["memory"]
    sets = "".join(f" --set {s}" for s in results["overrides"])
    notes = [
        f"Peaks measured in the same process at {_n(peaks['threads'], 'thread')}: a ({m}, {k}) "
        f"@ ({k}, {n}) matrix product (the model's MLP shape), {gemm}; memory "
        f"{memory['bytes_per_s'] / 1e9:.1f} GB/s (a {memory['mib']} MiB copy "
        f"{memory['copy_bytes_per_s'] / 1e9:.1f}, a sum {memory['sum_bytes_per_s'] / 1e9:.1f}).",
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
    if results.get("flags"):
        notes.append(
            "Timing flagged, the machine was not quiet: " + "; ".join(results["flags"]) + "."
        )
    return "\n".join(lines) + "\n\n" + " ".join(notes)


def render(records: dict, source: Callable[..., str], name: str = "roofline") -> str:
    """The `roofline` block of docs/performance.md: the record's table and where it comes from."""
    record = records[name]
    return table(record["results"]) + "\n\n" + source(record)
