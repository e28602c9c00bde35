"""End-to-end tests of `grpo train`: the run directory, reproducibility, kill -9 and resume, presets.

Runs go through a real subprocess (`python -m grpo train`) on the shipped demo
model at a reduced size, so the console script's whole path is exercised.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo.step.timing import PHASES

REPO = Path(__file__).resolve().parents[2]
DEMO_MODEL = REPO / "grpo" / "assets" / "arith-tiny"
MEASURED = ("time/", "throughput/", "memory/")  # wall time and memory: never reproducible

SMALL = f"""
model: {{path: {DEMO_MODEL}, device: cpu}}
task: {{name: arithmetic, train_size: 64, eval_size: 8}}
prompts_per_step: 4
seed: 3
grpo: {{group_size: 4, batch_size: 8, num_epochs_per_update: 2, kl_coeff: 0.05}}
policy: {{generation: {{max_new_tokens: 4}}, micro_batch_size: 16}}
schedule: {{num_steps: 6, learning_rate: 1.0e-3, lr_scheduler: cosine, warmup_steps: 1}}
evaluation: {{every: 3, modes: [greedy, sampled], batch_size: 8, num_logged_samples: 2}}
run: {{checkpoint_every: 2, threads: 1, log_every: 1}}
"""


def grpo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true"}
    return subprocess.run(
        [sys.executable, "-m", "grpo", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def config_file(tmp_path: Path, text: str = SMALL) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in row.items() if not k.startswith(MEASURED)} for row in rows]
    return [row for row in rows if set(row) != {"step"}]  # a checkpoint's time: measured only


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One complete small run with W&B offline, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("run")
    run = tmp / "run"
    out = grpo("train", config_file(tmp), "--set", f"run.dir={run}",
               "--set", "run.wandb={mode: offline}")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return run, out


def test_a_run_writes_every_file_of_its_directory(finished_run):
    """config, metrics, samples, TensorBoard, W&B, manifested checkpoints, HF model, plot, summary."""
    run, out = finished_run
    assert (run / "config.yaml").read_text().startswith("preset: null\nmodel:")
    rows = metrics(run)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if "eval/greedy/accuracy" in r] == [0, 3, 6]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {0, 3, 6}
    assert {"prompt", "completion", "reward", "mode"} <= set(samples[0])
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000004", "step-000006"]
    assert (run / "checkpoints" / "step-000006" / "manifest.json").is_file()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(run / "final")
    AutoTokenizer.from_pretrained(run / "final")
    assert (run / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and "eval/greedy/accuracy" in summary["after"]
    assert "held-out evaluation" in out.stdout and "eval/greedy/accuracy" in out.stdout
    assert "step 6/6" in out.stderr  # plain progress lines off a terminal


def test_a_run_logs_time_throughput_and_memory_and_says_where_it_writes(finished_run):
    """Every step row has its time by phase (summing to time/step), throughput and memory;
    evaluations and checkpoints have their times; the first line names the run directory."""
    run, out = finished_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    phases = [f"time/{p}" for p in PHASES] + ["time/other"]
    for row in steps:
        assert sum(row[k] for k in phases) == pytest.approx(row["time/step"], rel=1e-9)
        assert min(row[k] for k in phases[:-1]) >= 0 and row["time/sampling"] > 0
        tokens = row["throughput/tokens_per_s"] * row["time/step"]  # 16 completions, <= 4 tokens
        assert 16 <= tokens <= 64 + 1e-6
        assert row["throughput/samples_per_s"] * row["time/step"] == pytest.approx(16)
        assert 0 < row["memory/rss_gib"] <= row["memory/peak_rss_gib"]
    assert [r["step"] for r in rows if "time/eval" in r] == [0, 3, 6]
    assert [r["step"] for r in rows if "time/checkpoint" in r] == [2, 4, 6]
    lines = out.stderr.splitlines()
    header = f"run directory {run}; watch it with: tensorboard --logdir {run / 'tensorboard'}"
    assert lines.index(header) < min(i for i, line in enumerate(lines) if line.startswith("step "))
    assert re.search(r"step 6/6 .* s/step \d+ tokens/s", out.stderr)


def test_the_same_seed_writes_identical_metrics_and_weights(finished_run, tmp_path):
    """A second run with the same config and seed repeats every metric and weight exactly (CPU)."""
    run, _ = finished_run
    again = tmp_path / "again"
    out = grpo("train", config_file(tmp_path), "--set", f"run.dir={again}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert metrics(again) == metrics(run)
    first, second = weights(run), weights(again)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_kill_9_then_resume_ends_at_the_uninterrupted_parameters(finished_run, tmp_path):
    """SIGKILL after checkpoint 2, then --resume: the same final weights and logs as no kill."""
    run, _ = finished_run
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "grpo", "train", config_file(tmp_path), "--set",
            f"run.dir={killed}", "--set", "schedule.num_steps=6"]  # fmt: skip
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step-000002").exists():
        assert process.poll() is None and time.monotonic() < deadline, "run ended before step 2"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "final").exists()  # it really died mid-run
    out = grpo("train", "--resume", str(killed))
    assert out.returncode == 0, out.stderr[-3000:]
    first, resumed = weights(run), weights(killed)
    assert all(torch.equal(first[k], resumed[k]) for k in first)
    assert metrics(killed) == metrics(run)


def test_resume_skips_a_truncated_checkpoint(finished_run, tmp_path):
    """A corrupt newest checkpoint is named on resume, and the previous one is used instead."""
    import shutil

    run, _ = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "final")
    state = copy / "checkpoints" / "step-000006" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    out = grpo("train", "--resume", str(copy))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step-000006 is corrupt: state.pt has 1000 bytes" in out.stderr
    assert json.loads((copy / "summary.json").read_text())["resumed_from"] == 4
    resumed = weights(copy)
    assert all(torch.equal(resumed[k], v) for k, v in weights(run).items())


def test_every_logged_metric_is_documented(finished_run):
    """Each key a run writes to metrics.jsonl is explained in docs/metrics.md."""
    import re

    run, _ = finished_run
    doc = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`([^`]+)`", doc))
    keys = {
        k for line in (run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)
    }
    missing = []
    for key in sorted(keys - {"step"}):
        general = re.sub(r"^epoch_\d+_", "epoch_{i}_", key)
        general = re.sub(r"rewards/[^/]+/", "rewards/<fn>/", general)
        general = re.sub(r"^eval/(greedy|sampled)/", "eval/<mode>/", general)
        candidates = {key, general, re.sub(r"/[^/]+$", "/...", general)}
        if not candidates & documented:
            missing.append(key)
    assert not missing, f"undocumented metrics: {missing}"


def test_torchrun_two_processes_rank_0_writes_and_a_1_process_resume_continues(tmp_path):
    """`torchrun --nproc-per-node 2 -m grpo train`: one run directory written by rank 0 only,
    steps over the global batch, and its checkpoint resumes in a single process (replicas
    staying identical is tests/test_distributed.py's)."""
    run = tmp_path / "ddp"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--standalone", "-m", "grpo", "train", config_file(tmp_path),
            "--set", f"run.dir={run}", "--set", "schedule.num_steps=4",
            "--set", "evaluation.every=0"]  # fmt: skip
    out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2, 3, 4]  # one writer
    assert all(r["total_samples"] == 16.0 for r in rows if "reward/mean" in r)  # global N
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    assert out.stdout.count("held-out evaluation") == 1
    import shutil

    copy = tmp_path / "resumed"  # the 2-process run as it stood at step 2, resumed in 1 process
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step-000004")
    shutil.rmtree(copy / "final")
    resumed = grpo("train", "--resume", str(copy))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in metrics(copy) if "reward/mean" in r] == [1, 2, 3, 4]
    assert json.loads((copy / "summary.json").read_text())["resumed_from"] == 2
