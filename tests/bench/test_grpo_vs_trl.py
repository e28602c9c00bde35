"""The side-by-side benchmark runs at a tiny size and reports what it promises (no timing asserts)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("psutil")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import grpo_vs_trl  # noqa: E402
from common import Workload, build_model  # noqa: E402
from workers import WORKERS  # noqa: E402

TINY = Workload(model="tiny", prompts=2, group_size=2, max_new_tokens=4, steps=1, threads=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("bench") / "tiny", "tiny")


@pytest.mark.parametrize("trainer", sorted(WORKERS))
def test_each_trainer_reports_times_tokens_and_memory(model_dir, trainer):
    """One timed step per trainer: a positive time, N x <= T tokens, <= T decoding steps covering
    the mean length, a peak RSS above setup."""
    record = WORKERS[trainer](model_dir, TINY)
    assert len(record["step_s"]) == len(record["tokens"]) == len(record["decode_steps"]) == 1
    assert all(t > 0 for t in record["step_s"])
    N, T = TINY.prompts * TINY.group_size, TINY.max_new_tokens
    assert all(0 < n <= N * T for n in record["tokens"])
    for n, longest in zip(record["tokens"], record["decode_steps"], strict=True):
        assert n / N <= longest <= T
    assert record["peak_rss_mib"] >= record["setup_rss_mib"] > 0
    assert len(record["cpu_s"]) == 1 and record["cpu_s"][0] > 0 and record["threads"] >= 1


def test_every_trl_configuration_checkpoints_gradients_as_grpo(model_dir, tmp_path):
    """TRL 1.16 defaults to gradient checkpointing; both bench configurations set grpo's (off)."""
    import accuracy_workers
    from trl import GRPOConfig as TRLConfig
    from trl_side import make_trl_trainer

    from grpo.lm.policy import CausalLMSettings

    default = TRLConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert default.gradient_checkpointing is True  # TRL 1.16's default
    ours = CausalLMSettings().gradient_checkpointing
    assert make_trl_trainer(model_dir, TINY, tmp_path).args.gradient_checkpointing is ours
    config = accuracy_workers.run_config([], 0, str(tmp_path / "run"))
    trl = accuracy_workers.trl_config(config, 0, tmp_path)
    assert trl.gradient_checkpointing is config.policy.gradient_checkpointing is False


@pytest.mark.parametrize(
    ("precision", "speedup", "bf16"),
    [("auto", 2.3, True), ("auto", 0.14, False), ("fp32", 2.3, False), ("bf16-mixed", 0.14, True)],
)
def test_trl_trains_at_the_precision_grpo_resolves(precision, speedup, bf16, tmp_path, monkeypatch):
    """TRL gets bf16=True exactly where grpo trains in bf16-mixed: `auto` as grpo resolves it
    from the CPU's measured bfloat16 speed, an explicit name as it is."""
    import accuracy_workers

    import grpo.precision

    monkeypatch.setattr(grpo.precision, "bfloat16_speedup", lambda: speedup)
    config = accuracy_workers.run_config([f"policy.precision={precision}"], 0, str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16-mixed where slower warns
        assert accuracy_workers.trl_config(config, 0, tmp_path).bf16 is bf16


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trl_scales_rewards_as_grpo_scales_advantages(scale, tmp_path):
    """TRL's scale_rewards names the divisor grpo's advantage_scale names; TRL has no other
    baseline than the group mean, so any other is refused rather than compared unlike."""
    import accuracy_workers

    config = accuracy_workers.run_config([f"grpo.advantage_scale={scale}"], 0, str(tmp_path))
    assert accuracy_workers.trl_config(config, 0, tmp_path).scale_rewards == scale
    config.grpo.advantage_baseline = "leave_one_out"
    with pytest.raises(ValueError, match="advantage_baseline='leave_one_out'"):
        accuracy_workers.trl_config(config, 0, tmp_path)


def test_trl_gets_the_chess_configs_kl_loss_and_sampling(tmp_path):
    """configs/chess.yaml maps to TRL's beta 0.1 with the plain k3 KL (no importance weight on
    it), its per-sequence loss ("grpo"), temperature 0.5, top-p 0.9 and G 4; the demo's to beta
    0 and the token mean ("dapo"); a denominator or KL estimator TRL lacks is refused."""
    import accuracy_workers

    chess = accuracy_workers.run_config(["config=configs/chess.yaml"], 0, str(tmp_path))
    trl = accuracy_workers.trl_config(chess, 0, tmp_path)
    assert (trl.beta, trl.use_bias_correction_kl, trl.loss_type) == (0.1, False, "grpo")
    assert (trl.temperature, trl.top_p, trl.num_generations) == (0.5, 0.9, 4)
    assert trl.learning_rate == chess.schedule.learning_rate
    assert accuracy_workers.headline(chess.task.name) == "eval/greedy/reward_mean"
    demo = accuracy_workers.trl_config(accuracy_workers.run_config([], 0, str(tmp_path)), 0, tmp_path)
    assert (demo.beta, demo.loss_type) == (0.0, "dapo")
    chess.grpo.kl_estimator = "k2"
    with pytest.raises(ValueError, match="kl_estimator='k2'"):
        accuracy_workers.trl_config(chess, 0, tmp_path)
    chess.grpo.kl_estimator, chess.grpo.aggregation = "k3", "sequence_sum"
    with pytest.raises(ValueError, match="aggregation='sequence_sum'"):
        accuracy_workers.trl_config(chess, 0, tmp_path)


def test_summary_ratio_and_overhead_follow_the_records():
    """s/step is the median, the ratio divides medians, the overhead compares time per decoding
    step (fewer tokens in as many decoding steps cost the same)."""

    def record(step_s, tokens, decode, setup, peak):
        return [{"step_s": step_s, "tokens": tokens, "decode_steps": decode,
                 "setup_rss_mib": setup, "peak_rss_mib": peak}]  # fmt: skip

    records = {
        "grpo": record([1.0, 3.0], [10, 10], [4, 4], 1, 4),
        "grpo_lean": record([1.0, 1.0], [10, 10], [4, 4], 1, 4),
        "trl": record([4.0, 4.0], [10, 10], [4, 4], 2, 8),
        "bare": record([1.0, 1.0], [16, 16], [2, 2], 1, 2),
        "bare_lean": record([0.125, 0.125], [16, 16], [2, 2], 1, 2),
    }
    summary = {name: grpo_vs_trl.summarise(r) for name, r in records.items()}
    grpo_vs_trl.compare(summary)
    assert summary["grpo"]["step_s"] == 2.0 and summary["grpo"]["tokens_per_s"] == 5.0
    assert summary["grpo/trl"] == 0.5
    assert summary["grpo/bare per decoding step - 1"] == pytest.approx(0.0)  # 0.5 s each
    assert summary["grpo_lean/trl"] == 0.25
    # each engine against its own floor: 0.25 s vs 0.0625 s per decoding step
    assert summary["grpo_lean/bare_lean per decoding step - 1"] == pytest.approx(3.0)
    assert "grpo_lean/bare per decoding step - 1" not in summary
    assert summary["trl"]["step_rss_mib"] == 6
    assert "| grpo | 2.000 |" in grpo_vs_trl.table(summary)
    assert "grpo_lean/trl: 0.250" in grpo_vs_trl.table(summary)


def test_script_runs_end_to_end(model_dir, tmp_path):
    """The command line: subprocess per run, a JSON summary with the workload."""
    out = tmp_path / "summary.json"
    argv = ["--model", "tiny", "-B", "2", "-G", "2", "-T", "4", "--steps", "1", "--runs", "1"]
    argv += ["--threads", "1", "--trainers", "bare", "--model-dir", str(model_dir)]
    summary = grpo_vs_trl.main([*argv, "--json", str(out)])
    assert out.is_file() and summary["bare"]["steps"] == 1
    assert summary["workload"]["max_new_tokens"] == 4
    assert isinstance(summary["bare"]["flagged"], list)


def test_flags_name_a_busy_machine_and_a_starved_run():
    """Load 1.5 on 2 cores (> 1) and 1.5 CPU-s over 1 wall-s on 2 threads (< 1.6) are flagged;
    2 CPU-s at load 0.5 is not."""
    clean = {"step_s": [0.5, 0.5], "cpu_s": [1.0, 1.0], "threads": 2, "cores": 2}
    assert grpo_vs_trl.run_flags({**clean, "load_before": 0.5}) == []
    assert grpo_vs_trl.run_flags({**clean, "load_before": 1.5}) == ["load 1.5 > 1"]
    starved = {**clean, "cpu_s": [0.75, 0.75], "load_before": 0.5}
    assert grpo_vs_trl.run_flags(starved) == ["CPU 0.75 x wall x 2 threads"]
    assert grpo_vs_trl.run_flags({"step_s": [1.0]}) == []  # a record without the measurements
