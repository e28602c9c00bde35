"""The GPU check's tables: every part of `bench/gpu_check.py`'s record, and the features table
(what `make test` shows on a CPU beside what the GPU check found).

Each renderer takes the records and `source` (`bench/provenance.py`), as
`bench/render_results.py` registers them.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["FEATURES", "features", "gpu_check", "gpu_summary"]


def gpu_summary(record: dict) -> str:
    parts = record["results"]["parts"].values()
    counts = {k: sum(p["status"] == k for p in parts) for k in ("ok", "failed", "skipped")}
    return f"{counts['ok']} parts ran, {counts['failed']} failed, {counts['skipped']} skipped"


def gpu_check(records: dict, source: Callable[..., str]) -> str:
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


def features(records: dict, source: Callable[..., str]) -> str:
    """What works, what `make test` checks on a CPU, and what the GPU check found."""
    report = records["gpu_check"]["results"] if "gpu_check" in records else None
    rows = ["| feature | tested on a CPU (`make test`) | on a GPU (`bench/gpu_check.py`) |",
            "|---|---|---|"]  # fmt: skip
    rows += [f"| {name} | {cpu} | {_gpu_cell(report, parts)} |" for name, cpu, parts in FEATURES]
    tail = source(records["gpu_check"]) if report else "No GPU check has run yet."
    return "\n".join(rows) + "\n\n" + tail
