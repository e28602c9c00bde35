"""bench/roofline_results.py: records side by side, phase by phase, each run's figures in its
own row, and what a run did not run or an older record did not measure said, not invented."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import render_results  # noqa: E402
import roofline_results  # noqa: E402

GIB = 2**30


def phase(name: str, label: str, seconds: float, limit: float, peak: float | None) -> dict:
    row = {"phase": name, "name": label, "seconds": seconds, "limit_s": limit,
           "x_of_limit": seconds / limit}  # fmt: skip
    if name != "total":
        row["dtype"] = "bfloat16"
    return row if peak is None else {**row, "peak_rss_bytes": peak}


def results(with_old_logprobs: bool, peaks: bool, batch: dict | None, state: int | None) -> dict:
    """A `bench/roofline.py` record's results; without `peaks`, `batch` or `state`, as an
    older record, which had none."""
    gib = (lambda x: x * GIB) if peaks else (lambda x: None)
    rows = [phase("sampling", "sampling (decoding)", 4.0, 2.0, gib(1.5))]
    if with_old_logprobs:
        rows.append(phase("old_logprobs", "old log-probs", 1.0, 0.5, gib(1.25)))
    rows += [phase("loss_backward", "loss forward + backward", 6.0, 1.5, gib(2.0)),
             phase("total", "these phases together", 11.0, 4.0, gib(2.0))]  # fmt: skip
    out = {"phases": rows, "flags": [],
           "model": {"model_type": "llama", "matmul_params": 134.5e6, "trainable_params": 2e6,
                     "frozen": ["model.embed_tokens.*"] if state else []},
           "tokens_per_step": {"sampled_groups": 4, "prompt_tokens_mean": 165.5,
                               "completions": 32, "completion_tokens_mean": 44.8,
                               "loss_rows": 32}}  # fmt: skip
    if batch is not None:
        out["batch"] = batch
    if state is not None:
        out["model"]["optimizer_state_bytes"] = state
        out["rss_after_warmup_bytes"] = 3 * GIB
    return out


BATCH = {"prompts": 4, "group_size": 8, "max_new_tokens": 128, "micro_batch_size": 8}


def test_two_runs_phase_by_phase_with_what_one_did_not_run_or_measure():
    """Rows alternate between the runs under each phase, phases in the order they run; the
    phase only the second ran says "did not run" for the first; an older record's peak and state are "-"; its batch is
    unrecorded, so the batches are said to differ; the phases together come last."""
    records = {"old": {"results": results(False, False, None, None)},
               "new": {"results": results(True, True, BATCH, GIB // 2)}}  # fmt: skip
    block = roofline_results.compare(records, lambda *r: f"{len(r)} sources",
                                     runs=(("old", "A"), ("new", "B")))  # fmt: skip
    lines = block.splitlines()
    assert lines[2:10] == [
        "| sampling (decoding) | A | 4 | 2 | 2.0 | - |",
        "|  | B | 4 | 2 | 2.0 | 1.50 GiB |",
        "| old log-probs | A | did not run | | | |",
        "|  | B | 1 | 0.5 | 2.0 | 1.25 GiB |",
        "| loss forward + backward | A | 6 | 1.5 | 4.0 | - |",
        "|  | B | 6 | 1.5 | 4.0 | 2.00 GiB |",
        "| these phases together | A | 11 | 4 | 2.8 | - |",
        "|  | B | 11 | 4 | 2.8 | 2.00 GiB |",
    ]
    assert ("| A | llama | 134.5M | 2.0M (frozen: nothing) | - | - | 4 x 165.5 | 32 x 44.8 "
            "| 32 |") in lines  # fmt: skip
    assert ("| B | llama | 134.5M | 2.0M (frozen: `model.embed_tokens.*`) | 0.50 GiB | 3.00 GiB "
            "| 4 x 165.5 | 32 x 44.8 | 32 |") in lines  # fmt: skip
    assert "B x G x T differ: A unrecorded, B 4 x 8 x 128" in block
    assert block.endswith("2 sources")


def test_the_same_batch_is_said_once_and_a_missing_record_is_named():
    """Both runs at 4 x 8 x 128: one sentence says so. A block whose second record is absent
    renders as not measured, naming that record."""
    same = {"a": {"results": results(False, True, BATCH, 1)},
            "b": {"results": results(False, True, BATCH, 1)}}  # fmt: skip
    block = roofline_results.compare(same, lambda *r: "", runs=(("a", "A"), ("b", "B")))
    assert "Every run samples B x G x T = 4 x 8 x 128 per step" in block
    missing = render_results.render_block("roofline-freeze", {"roofline_gemma": same["a"]})
    assert "`bench/results/roofline_gemma_unfrozen.json`, which does not exist yet" in missing


def _with_peak(results: dict, gflops: float, float32: float = 100.0) -> dict:
    return {**results, "peaks": {"matmul": {"bfloat16": {"flops_per_s": gflops * 1e9},
                                            "float32": {"flops_per_s": float32 * 1e9}}}}  # fmt: skip


def _in_float32(results: dict) -> dict:
    phases = [{**r, "dtype": "float32"} if "dtype" in r else r for r in results["phases"]]
    return {**results, "phases": phases}


def test_runs_on_a_machine_of_different_speed_are_said_not_to_compare_in_seconds():
    """Peaks of 801 and 349 GFLOP/s (a run on a busy machine): one sentence names both and
    says the seconds do not compare; peaks within PEAK_SPREAD of each other, or a run
    without peaks, say nothing."""
    def block(rate_a: float, rate_b: float | None) -> str:
        b = results(False, True, BATCH, 1)
        records = {"a": {"results": _with_peak(results(False, True, BATCH, 1), rate_a)},
                   "b": {"results": b if rate_b is None else _with_peak(b, rate_b)}}  # fmt: skip
        return roofline_results.compare(records, lambda *r: "", runs=(("a", "A"), ("b", "B")))

    slow = block(801.4, 349.3)
    assert "different bfloat16 matrix-product peaks (A 801, B 349 GFLOP/s)" in slow
    assert "their seconds do not compare" in slow
    for quiet in (block(801.0, 700.0), block(801.0, None)):
        assert "matrix-product peaks" not in quiet


def test_float32_runs_compare_their_float32_peaks():
    """Runs that multiply in float32: equal bfloat16 peaks say nothing; float32 peaks of 170
    and 120 GFLOP/s (more than PEAK_SPREAD apart) are named, in float32."""
    def run(float32: float) -> dict:
        return {"results": _in_float32(_with_peak(results(False, True, BATCH, 1), 801.0, float32))}

    text = roofline_results.compare({"a": run(170.4), "b": run(119.6)}, lambda *r: "",
                                    runs=(("a", "A"), ("b", "B")))  # fmt: skip
    assert "different float32 matrix-product peaks (A 170, B 120 GFLOP/s)" in text
    assert "different bfloat16" not in text
    same = roofline_results.compare({"a": run(170.0), "b": run(160.0)}, lambda *r: "",
                                    runs=(("a", "A"), ("b", "B")))  # fmt: skip
    assert "matrix-product peaks" not in same
