"""bench/time_to_accuracy.py: its summary on hand-made records, and a tiny real run of both
libraries (no timing asserts)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import time_to_accuracy as tta  # noqa: E402


def _record(library: str, points: list[tuple[int, float, float]]) -> dict:
    return {
        "library": library,
        "seed": 0,
        "points": [{"step": s, "seconds": t, "accuracy": a} for s, t, a in points],
    }


def test_summary_hand_values():
    """TRL's median final is the target; each library's median time to reach it and its accuracy
    at 1/4, 1/2 and all of TRL's median training time are read off the evaluations."""
    records = [
        _record("grpo", [(0, 0.0, 0.3), (10, 10.0, 0.6), (20, 20.0, 0.8)]),
        _record("trl", [(0, 0.0, 0.3), (10, 40.0, 0.5), (20, 80.0, 0.7)]),
        _record("grpo", [(0, 0.0, 0.3), (10, 12.0, 0.7), (20, 24.0, 0.9)]),
        _record("trl", [(0, 0.0, 0.3), (10, 40.0, 0.6), (20, 80.0, 0.8)]),
    ]
    s = tta.summarise(records)
    assert s["trl"]["final_accuracy"] == pytest.approx(0.75)  # median of 0.7 and 0.8
    assert s["trl"]["seconds"] == 80.0 and s["grpo"]["seconds"] == 22.0
    assert s["grpo"]["seconds_per_step"] == pytest.approx(1.1)
    # first evaluation at or above 0.75: grpo at 20 s and 24 s; TRL never / at 80 s
    assert s["grpo"]["time_to_trl_final"] == 22.0
    assert s["trl"]["time_to_trl_final"] == float("inf")  # median of (inf, 80)
    # at 20 s (a quarter of 80 s): grpo 0.8 and 0.7 (its last evaluation before 20 s is at 12 s)
    assert s["grpo"]["accuracy_at"] == pytest.approx({"0.25": 0.75, "0.5": 0.85, "1": 0.85})
    assert s["trl"]["accuracy_at"] == pytest.approx({"0.25": 0.3, "0.5": 0.55, "1": 0.75})
    assert s["grpo"]["final_sd"] == pytest.approx(0.1 / 2**0.5)
    assert s["ratio_to_trl_run"] == 22.0 / 80.0  # grpo's time to TRL's final / TRL's whole run
    assert "| grpo | 20 | 85.0 %" in tta.table(s)
    assert "TRL's whole training run: 0.28" in tta.table(s)


def test_no_time_ratio_when_trl_ends_no_higher_than_it_started():
    """TRL's final at or below its step-0 accuracy is reached at 0 s by both libraries: the
    summary gives no ratio (None, not 0 or a division by zero) and the table says why."""
    records = [
        _record("grpo", [(0, 0.0, 0.278), (16, 530.0, 0.355)]),
        _record("trl", [(0, 0.0, 0.278), (10, 1407.0, 0.26), (20, 2793.0, 0.2575)]),
    ]
    s = tta.summarise(records)
    assert s["trl_start"] == 0.278 and s["grpo"]["time_to_trl_final"] == 0.0
    assert s["ratio_to_trl_run"] is None and s["ratio_time_to_trl_final"] is None
    assert s["grpo"]["accuracy_at"]["0.25"] == 0.355 and s["trl"]["accuracy_at"]["1"] == 0.2575
    text = tta.table(s)
    assert "no higher than its start (27.8 %): no time ratio" in text
    assert "TRL's whole training run" not in text


def test_peak_memory_is_compared_as_a_ratio_of_medians():
    """grpo's median peak RSS over TRL's: (2 + 4) / 2 = 3 GiB over the median of 4, 5 and 7."""
    records = [_record(lib, [(0, 0.0, 0.3), (10, 10.0, 0.6)]) for lib in ["grpo"] * 2 + ["trl"] * 3]
    for record, peak in zip(records, (2.0, 4.0, 5.0, 4.0, 7.0), strict=True):
        record["peak_rss_gib"] = peak
    s = tta.summarise(records)
    assert s["ratio_peak_rss"] == 3.0 / 5.0
    assert "grpo / TRL peak RSS: 0.60" in tta.table(s)


def test_busy_or_starved_runs_are_flagged_in_the_table():
    """A run that started with load above half the cores, or got CPU under 0.8 x wall x threads,
    is named in its library's row; a clean one and a record without measurements are not."""
    clean, busy, starved, old = (
        _record(lib, [(0, 0.0, 0.3), (10, 10.0, 0.6)]) for lib in ("grpo", "grpo", "trl", "trl")
    )
    for record, load, cpu in ((clean, 0.5, 19.0), (busy, 1.5, 19.0), (starved, 0.5, 15.0)):
        record.update(load_before=load, cores=2, threads=2)
        record["points"][-1]["cpu_seconds"] = cpu
    busy["seed"], starved["seed"] = 1, 2
    assert tta.run_flags(clean) == [] and tta.run_flags(old) == []
    assert tta.run_flags(busy) == ["load 1.5 > 1"]
    assert tta.run_flags(starved) == ["CPU 0.75 x wall x 2 threads"]
    text = tta.table(tta.summarise([clean, busy, starved, old]))
    assert "| seed 1: load 1.5 > 1 |" in text and "| seed 2: CPU 0.75 x wall x 2 threads |" in text


def test_a_grpo_train_run_directory_reads_as_a_record(tmp_path):
    """Training seconds and sampling seconds before each evaluation are the sums of the steps'
    `time/step` and `time/sampling` up to it; the peak RSS is the largest logged."""
    rows = [
        {"step": 0, "eval/greedy/accuracy": 0.25, "eval/heldout_phrasings/greedy/accuracy": 0.2},
        {"step": 1, "time/step": 10.0, "time/sampling": 4.0, "memory/peak_rss_gib": 3.0},
        {"step": 2, "time/step": 12.0, "time/sampling": 5.0, "memory/peak_rss_gib": 3.5},
        {"step": 2, "eval/greedy/accuracy": 0.5, "eval/heldout_phrasings/greedy/accuracy": 0.4},
        {"step": 3, "time/step": 11.0, "time/sampling": 6.0, "memory/peak_rss_gib": 3.25},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.yaml").write_text("seed: 7\nrun:\n  threads: 2\n")
    record = tta.record_of_run(str(tmp_path))
    assert record["library"] == "grpo" and record["seed"] == 7 and record["threads"] == 2
    assert record["peak_rss_gib"] == 3.5
    assert [(p["step"], p["seconds"], p["sampling_seconds"], p["accuracy"]) for p in record["points"]] \
        == [(0, 0.0, 0.0, 0.25), (2, 22.0, 9.0, 0.5)]  # fmt: skip
    assert record["points"][1]["heldout_phrasings/greedy/accuracy"] == 0.4
    summary = tta.summarise([record])
    assert summary["grpo"]["sampling_per_step"] == 4.5 and summary["grpo"]["seconds_per_step"] == 11.0


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (.[bench])")
def test_both_libraries_run_with_their_own_schedules(tmp_path):
    """One seed each, grpo 4 steps and TRL 2: records at every evaluation, the JSON and the PNG."""
    out = tmp_path / "tta.json"
    summary = tta.main(
        ["--seeds", "1", "--grpo-steps", "4", "--trl-steps", "2", "--eval-every", "2",
         "--set", "task.eval_size=20", "--json", str(out), "--png", str(tmp_path / "tta.png")]
    )  # fmt: skip
    assert summary["grpo"]["steps"] == 4 and summary["trl"]["steps"] == 2
    written = json.loads(out.read_text())
    steps = {r["library"]: [p["step"] for p in r["points"]] for r in written["records"]}
    assert steps == {"grpo": [0, 2, 4], "trl": [0, 2]}
    assert all(0 <= p["accuracy"] <= 1 for r in written["records"] for p in r["points"])
    for record in written["records"]:  # what the flags are computed from
        assert record["load_before"] >= 0 and record["threads"] >= 1 and record["cores"] >= 1
        assert record["points"][-1]["cpu_seconds"] > 0
        last = record["points"][-1]  # the sampler's share of the training time, and the memory
        assert 0 < last["sampling_seconds"] < last["seconds"] and record["peak_rss_gib"] > 0.1
    assert isinstance(summary["trl"]["flagged"], list)
    assert (tmp_path / "tta.png").stat().st_size > 10_000


def test_a_run_whose_threads_sleep_is_flagged_only_when_its_main_thread_starved(monkeypatch):
    """With OMP_WAIT_POLICY=PASSIVE (the harness's default) one busy thread is expected: 1.7 CPU
    seconds over 2 s of wall on 2 threads is clean, 1.5 is flagged; spinning threads are held
    to both threads; the harness's environment keeps a policy the user set."""
    from common import busy_threads, worker_env

    assert busy_threads(2, {"OMP_WAIT_POLICY": "PASSIVE"}) == 1 and busy_threads(2, {}) == 2
    record = _record("grpo", [(0, 0.0, 0.3), (10, 2.0, 0.6)])
    record.update(load_before=0.1, cores=2, threads=2, busy_threads=1)
    record["points"][-1]["cpu_seconds"] = 1.7
    assert tta.run_flags(record) == []
    record["points"][-1]["cpu_seconds"] = 1.5
    assert tta.run_flags(record) == ["CPU 0.75 x wall x 1 threads"]
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert worker_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert worker_env()["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (.[bench])")
def test_the_gemma3_workload_runs_both_libraries_through_one_evaluator(tmp_path, wide_gemma3):
    """configs/gemma3_math.yaml on a tiny base Gemma 3 (its sampler, prompts and stop as they
    are): one step of each library, each evaluated on the three held-out splits by grpo's
    evaluator, which gives both the same step-0 figures (the same weights, the same code)."""
    out = tmp_path / "gemma3.json"
    sets = [f"model.path={wide_gemma3}", "task.train_size=8", "task.eval_size=2",
            "prompts_per_step=2", "grpo.group_size=2", "grpo.batch_size=2",
            "grpo.gradient_accumulation_steps=2", "policy.micro_batch_size=2",
            "policy.generation.max_new_tokens=8", "run.threads=1"]  # fmt: skip
    tta.main(["--workload", "gemma3", "--seeds", "1", "--steps", "1", "--eval-every", "1",
              *(arg for value in sets for arg in ("--set", value)), "--json", str(out)])  # fmt: skip
    written = json.loads(out.read_text())
    assert written["overrides"][0] == "config=configs/gemma3_math.yaml"
    records = {record["library"]: record for record in written["records"]}
    assert sorted(records) == ["grpo", "trl"]
    for record in records.values():
        assert [p["step"] for p in record["points"]] == [0, 1]
        for split in ("heldout_numbers", "heldout_phrasings", "heldout_bare"):
            assert 0 <= record["points"][-1][f"{split}/greedy/accuracy"] <= 1
    clocks = ("seconds", "cpu_seconds", "sampling_seconds")
    start = {lib: {k: v for k, v in r["points"][0].items() if k not in clocks}
             for lib, r in records.items()}  # fmt: skip
    assert start["grpo"] == start["trl"] and "greedy/length_mean" in start["trl"]
