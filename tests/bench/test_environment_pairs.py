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


def _roofline(loss_s: float, optimizer_s: float, lengths: tuple[float, ...] = (25.0, 25.0),
              rss_gib: tuple[float | None, float | None] = (1.0, 0.5)) -> dict:  # fmt: skip
    """A roofline result: the loss phase and the optimizer, each with its own peak RSS; one
    measured step a completion length in `lengths` (4 completions of that mean length)."""
    rss = [None if g is None else g * 2**30 for g in rss_gib]
    phases = [
        {"phase": "loss_backward", "name": "loss forward + backward", "seconds": loss_s,
         "flops": 1e12, "peak_rss_bytes": rss[0]},
        {"phase": "optimizer", "name": "optimizer (clip + AdamW)", "seconds": optimizer_s,
         "flops": None, "peak_rss_bytes": rss[1]},
    ]  # fmt: skip
    steps = [{"tokens": {"completions": 4, "completion_tokens_mean": mean},
              "phases": {"sampling": {"flops": mean * 4e9}, "loss_backward": {"flops": 1e12}}}
             for mean in lengths]  # fmt: skip
    mean = sum(lengths) / len(lengths)
    return {"phases": phases, "dtypes": {"scoring": "float32"},
            "peaks": {"matmul": {"float32": {"flops_per_s": 150e9}}}, "flags": [],
            "tokens_per_step": {"completions": 4, "completion_tokens_mean": mean},
            "per_step": steps}  # fmt: skip


def _measure(runs: list[dict], *argv: str) -> dict:
    order = iter(runs)
    return ep.measure(ep.parse_args(["--env", "A=1", *argv]), run=lambda *a: next(order))


def test_without_takes_the_variables_out_and_with_sets_them_keeping_the_rest():
    base = {"PATH": "/bin", "THP_MEM_ALLOC_ENABLE": "0"}
    envs = ep.environments({"THP_MEM_ALLOC_ENABLE": "1"}, base)
    assert envs == {"without": {"PATH": "/bin"},
                    "with": {"PATH": "/bin", "THP_MEM_ALLOC_ENABLE": "1"}}  # fmt: skip


@pytest.mark.parametrize("pair", ["THP_MEM_ALLOC_ENABLE", "=1"])
def test_a_variable_that_is_not_key_equals_value_is_refused_by_name(pair):
    with pytest.raises(SystemExit, match=pair):
        ep.parse_args(["--env", pair])


@pytest.mark.parametrize("option", ["--rounds", "--steps"])
def test_no_rounds_or_no_steps_is_refused_before_anything_runs(option, capsys):
    with pytest.raises(SystemExit):
        ep.parse_args(["--env", "A=1", option, "0"])
    assert f"{option} 0: allowed: >= 1" in capsys.readouterr().err


def test_runs_alternate_and_the_ratio_is_with_over_without_pair_by_pair(monkeypatch):
    """Without 10 s and 12 s, with 8 s and 6 s for the same tokens: ratios 0.8 and 0.5, median
    0.65; the optimizer 0.4 / 0.5. Peak RSS is each phase's largest over its side's runs. Every
    run gets the measured processes' environment (OMP_WAIT_POLICY=PASSIVE)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    seen = []
    without = iter([_roofline(10, 0.5), _roofline(12, 0.5, rss_gib=(1.5, 0.25))])
    with_ = iter([_roofline(8, 0.4, rss_gib=(2.0, 0.75)), _roofline(6, 0.4)])

    def run(env, config, steps, overrides):
        side = "with" if env.get("SOME_VARIABLE") == "1" else "without"
        seen.append((side, env["OMP_WAIT_POLICY"], config, steps, tuple(overrides)))
        return next(with_ if side == "with" else without)

    args = ep.parse_args(["--env", "SOME_VARIABLE=1", "--set", "policy.precision=fp32",
                          "--rounds", "2", "--steps", "1"])  # fmt: skip
    results = ep.measure(args, run=run)
    one = ("PASSIVE", "configs/smollm2_math.yaml", 1, ("policy.precision=fp32",))
    assert seen == [("without", *one), ("with", *one)] * 2
    loss = results["phases"]["loss_backward"]
    assert loss["ratios"] == pytest.approx([0.8, 0.5])
    assert loss["median_ratio"] == pytest.approx(0.65)
    assert [r["seconds"] for r in loss["without"]] == [10, 12]
    assert results["phases"]["optimizer"]["ratios"] == pytest.approx([0.8, 0.8])
    assert results["peak_rss_gib"] == {"without": {"loss_backward": 1.5, "optimizer": 0.5},
                                       "with": {"loss_backward": 2.0, "optimizer": 0.75}}  # fmt: skip
    assert results["agreement"] == "same"
    table = ep.table(results)
    assert "| loss forward + backward | 10.00, 12.00 | 8.00, 6.00 | 0.80, 0.50 | 0.65 | 1.50, 2.00 |" in table
    assert "| optimizer (clip + AdamW) | 0.50, 0.50 | 0.40, 0.40 | 0.80, 0.80 | 0.80 | 0.50, 0.75 |" in table
    assert "whatever changed was the time" in ep.note(results)
    assert "OMP_WAIT_POLICY=PASSIVE" in ep.note(results)


def test_a_phase_without_a_peak_rss_is_shown_as_a_dash():
    results = _measure([_roofline(10, 0.5, rss_gib=(1.0, None)), _roofline(9, 0.5, rss_gib=(1.0, None))],
                       "--rounds", "1")  # fmt: skip
    assert results["peak_rss_gib"]["with"] == {"loss_backward": 1.0, "optimizer": None}
    assert "| optimizer (clip + AdamW) | 0.50 | 0.50 | 1.00 | 1.00 | -, - |" in ep.table(results)


def test_steps_of_other_lengths_with_the_same_mean_are_told_apart():
    """Each side repeats itself, the sides differ step by step (25 then 30 tokens against 30
    then 25), though the mean length of every run is the same: the variable changed what was
    computed."""
    a, b = (25.0, 30.0), (30.0, 25.0)
    results = _measure([_roofline(10, 0.5, a), _roofline(10, 0.5, b),
                        _roofline(10, 0.5, a), _roofline(10, 0.5, b)], "--rounds", "2")  # fmt: skip
    assert results["agreement"] == "sides differ"
    assert "the variable changed what was computed" in ep.note(results)


def test_a_side_that_does_not_repeat_itself_is_not_blamed_on_the_variable():
    a, b = (25.0, 30.0), (30.0, 25.0)
    results = _measure([_roofline(10, 0.5, a), _roofline(10, 0.5, a),
                        _roofline(10, 0.5, b), _roofline(10, 0.5, a)], "--rounds", "2")  # fmt: skip
    assert results["agreement"] == "runs differ"
    assert "a run does not repeat itself here" in ep.note(results)


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
