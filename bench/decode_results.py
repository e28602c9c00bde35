"""The decoding tables of docs/performance.md (`bench/render_results.py`): the lean engine against
the transformers engine on Gemma 3 (`bench/vllm_rollout.py`), and against llama.cpp on the same
weights (`bench/llamacpp_decode.py`, which prints `llamacpp_table` too)."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SAME_WEIGHTS", "lean_gemma", "llamacpp", "llamacpp_table"]

SAME_WEIGHTS = {"grpo-float32": "llama.cpp-F32", "grpo-bfloat16": "llama.cpp-BF16"}
"""Each grpo part -> the llama.cpp part that decodes the same weights."""


def lean_gemma(records: dict, source: Callable[..., str]) -> str:
    """`bench/vllm_rollout.py --models gemma --engines transformers lean`: tokens per second of
    each engine on Gemma 3 270M, and lean's over the transformers engine's."""
    record = records["lean_gemma_rollout"]
    r = record["results"]
    base = r["gemma-transformers"]["rollout_tokens_per_s"]
    rows = ["| engine | tokens/s | rollout s | mean completion tokens | x the transformers engine |",
            "|---|---|---|---|---|"]  # fmt: skip
    for engine in ("transformers", "lean"):
        e = r[f"gemma-{engine}"]
        rows.append(f"| {engine} | {e['rollout_tokens_per_s']:.1f} | {e['rollout_s']:.1f} | "
                    f"{e['mean_completion_tokens']:.1f} | {e['rollout_tokens_per_s'] / base:.2f} |")
    return "\n".join(rows) + "\n\n" + source(record)


def llamacpp_table(parts: dict[str, dict]) -> str:
    """One row a part: tokens/s, its tokens/s over llama.cpp's at the same weights
    (`SAME_WEIGHTS`), the median rollout and the logit gap (llama.cpp's against the float32
    model's forward; grpo's, the engine's own check against it)."""
    rows = ["| decoder | weights | tokens/s | x llama.cpp, same weights | rollout s (median) "
            "| logit gap |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in parts.items():
        if "failed" in r:
            rows.append(f"| {name} | {r['weights']} | {r['failed']} | - | - | - |")
            continue
        other = parts.get(SAME_WEIGHTS.get(name, ""))
        other = None if other is None or "failed" in other else other
        ratio = f"{r['tokens_per_s'] / other['tokens_per_s']:.2f}" if other else "-"
        gap = r.get("logit_gap", r.get("check_gap"))
        rows.append(f"| {name} | {r['weights']} | {r['tokens_per_s']:.0f} | {ratio} | "
                    f"{r['median_s']:.2f} | {gap:.1e} |")  # fmt: skip
    return "\n".join(rows)


def llamacpp(records: dict, source: Callable[..., str], name: str = "llamacpp_decode") -> str:
    """A `bench/llamacpp_decode.py` record: the table, the workload and where it comes from."""
    record = records[name]
    r = record["results"]
    w = r["workload"]
    prompts = w["prompt_tokens"]
    cpp = next((p for p in r["parts"].values() if "system_info" in p), None)
    lines = [
        llamacpp_table(r["parts"]),
        "",
        f"{w['B']} prompts of {min(prompts)}-{max(prompts)} tokens from `{r['config']}` x "
        f"{w['G']} completions x exactly {w['T']} new tokens ({w['B'] * w['G'] * w['T']} tokens a "
        f"rollout, prefill included in the time), temperature {w['temperature']:g}, "
        f"{w['threads']} threads; median of the timed rollouts after one warm-up."
        + (f" llama-cpp-python {cpp['llama_cpp_python']}, built here: `{cpp['system_info']}`."
           if cpp else ""),  # fmt: skip
        "",
        source(record),
    ]
    return "\n".join(lines)
