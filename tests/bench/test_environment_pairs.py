"""bench/environment_pairs.py: the runs alternate without and with the variables, each in a
process whose environment has them or lacks them, and each phase's ratio is with over
without, pair by pair."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import environment_pairs as ep  # noqa: E402


def _roofline(loss_s: float, optimizer_s: float, tokens: float = 100.0,
              rss_gib: float = 1.0) -> dict:  # fmt: skip
    rss = rss_gib * 2**30
    phases = [
        {"phase": "loss_backward", "name": "loss forward + backward", "seconds": loss_s,
         "flops": 1e12, "peak_rss_bytes": rss},
        {"phase": "optimizer", "name": "optimizer (clip + AdamW)", "seconds": optimizer_s,
         "flops": None, "peak_rss_bytes": rss},
    ]  # fmt: skip
    step = {"tokens": {"completions": 4, "completion_tokens_mean": tokens / 4},
            "phases": {"sampling": {"flops": tokens * 1e9}, "loss_backward": {"flops": 1e12}}}
    return {"phases": phases, "peaks": {"matmul": {"float32": {"flops_per_s": 150e9}}},
            "tokens_per_step": step["tokens"], "per_step": [step, step]}


def test_without_takes_the_variables_out_and_with_sets_them_keeping_the_rest():
    base = {"PATH": "/bin", "THP_MEM_ALLOC_ENABLE": "0"}
    envs = ep.environments({"THP_MEM_ALLOC_ENABLE": "1"}, base)
    assert envs == {"without": {"PATH": "/bin"},
                    "with": {"PATH": "/bin", "THP_MEM_ALLOC_ENABLE": "1"}}  # fmt: skip


@pytest.mark.parametrize("pair", ["THP_MEM_ALLOC_ENABLE", "=1"])
def test_a_variable_that_is_not_key_equals_value_is_refused_by_name(pair):
    with pytest.raises(SystemExit, match=pair):
        ep.parse_args(["--env", pair])


def test_runs_alternate_and_the_ratio_is_with_over_without_pair_by_pair():
    """Without 10 s and 12 s, with 8 s and 6 s for the same tokens: ratios 0.8 and 0.5, median
    0.65; the optimizer 0.4 / 0.5. Peak RSS is each side's largest; the same completions
    everywhere are read as such."""
    seen = []
    without = iter([_roofline(10, 0.5), _roofline(12, 0.5, rss_gib=1.5)])
    with_ = iter([_roofline(8, 0.4, rss_gib=2.0), _roofline(6, 0.4)])

    def run(env, config, steps, overrides):
        side = "with" if env.get("SOME_VARIABLE") == "1" else "without"
        seen.append((side, config, steps, tuple(overrides)))
        return next(with_ if side == "with" else without)

    args = ep.parse_args(["--env", "SOME_VARIABLE=1", "--set", "policy.precision=fp32",
                          "--rounds", "2", "--steps", "1"])  # fmt: skip
    results = ep.measure(args, run=run)
    one = ("configs/smollm2_math.yaml", 1, ("policy.precision=fp32",))
    assert seen == [("without", *one), ("with", *one)] * 2
    loss = results["phases"]["loss_backward"]
    assert loss["ratios"] == pytest.approx([0.8, 0.5])
    assert loss["median_ratio"] == pytest.approx(0.65)
    assert [r["seconds"] for r in loss["without"]] == [10, 12]
    assert results["phases"]["optimizer"]["ratios"] == pytest.approx([0.8, 0.8])
    assert results["peak_rss_gib"] == {"without": {"loss_backward": 1.5, "optimizer": 1.5},
                                       "with": {"loss_backward": 2.0, "optimizer": 2.0}}  # fmt: skip
    assert results["same_completions"] is True
    assert "| loss forward + backward | 10.00, 12.00 | 8.00, 6.00 | 0.80, 0.50 | 0.65 |" in ep.table(results)
    assert "the variable changed the time, not, as far as these show" in ep.note(results)


def test_runs_that_sampled_differently_are_told_apart():
    runs = iter([_roofline(10, 0.5), _roofline(8, 0.4, tokens=90)])
    results = ep.measure(ep.parse_args(["--env", "A=1", "--rounds", "1"]),
                         run=lambda *a: next(runs))  # fmt: skip
    assert results["same_completions"] is False
    assert "changed what was computed" in ep.note(results)


def test_the_child_process_sees_the_environment_it_is_given(monkeypatch):
    """The real subprocess path, with the roofline replaced by a script that writes back the
    variable it sees and the arguments it got."""
    script = ("import json, os, sys; json.dump({'seen': os.environ.get('SOME_VARIABLE'), "
              "'argv': sys.argv[2:]}, open(sys.argv[1], 'w'))")  # fmt: skip
    monkeypatch.setattr(ep, "RUN_ROOFLINE", script)
    envs = ep.environments({"SOME_VARIABLE": "1"}, {"PATH": "/usr/bin:/bin", "SOME_VARIABLE": "0"})
    got = ep.roofline_with(envs["with"], "c.yaml", 2, ["a=1"])
    assert got == {"seen": "1", "argv": ["c.yaml", "--steps", "2", "--set", "a=1"]}
    assert ep.roofline_with(envs["without"], "c.yaml", 2, [])["seen"] is None
