"""The fill-in example (examples/fill_in.yaml + task.py) through `grpo train`, at a reduced size."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo.cli.tasks import build_task
from grpo.run.config_files import load_config
from grpo.run.train import train

REPO = Path(__file__).resolve().parents[1]


def test_small_fill_in_run_raises_held_out_judge_score(tmp_path, monkeypatch):
    """GRPO raises the frozen judge's mean score on held-out windows; KL starts at 0 and grows."""
    monkeypatch.chdir(REPO)  # the config names its task by a path relative to the repository
    config = load_config(str(REPO / "examples" / "fill_in.yaml"), [
        f"run.dir={tmp_path / 'run'}", "task.options.pretrain_steps=150",
        "task.options.judge_steps=400", "task.options.held_out=48", "task.options.pool_size=512",
        "schedule.num_steps=40", "schedule.learning_rate=2e-3", "prompts_per_step=8",
        "grpo.batch_size=32", "evaluation.every=20", "run.checkpoint_every=20", "run.threads=2",
    ])  # fmt: skip
    summary = train(config, build_task)
    before, after = summary["before"], summary["after"]
    assert after["eval/judge"] > before["eval/judge"] + 0.05, summary
    assert before["eval/kl"] == 0.0 and after["eval/kl"] > 0.0
    run = tmp_path / "run"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {0, 20, 40} and "_" in samples[0]["prompt"]
    assert "_" not in samples[0]["completion"]  # every masked character was filled
    state = torch.load(run / "checkpoints" / "step-000020" / "state.pt", weights_only=True)
    assert state["trainer"]["step_count"] == 20
    saved = torch.load(run / "final" / "fill_in.pt", weights_only=True)
    assert set(saved) == {"generator", "judge", "chars", "settings"}
