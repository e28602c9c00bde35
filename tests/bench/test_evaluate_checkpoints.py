"""bench/evaluate_checkpoints.py and its rows in bench/run_curve.py: a checkpoint evaluated after
the run scores what the run's own evaluation at that step scored, and joins the curve there."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import evaluate_checkpoints  # noqa: E402
import run_curve  # noqa: E402

from grpo.cli import main as grpo  # noqa: E402

DEMO_MODEL = Path(__file__).resolve().parents[2] / "grpo" / "assets" / "arith-tiny"


def _train(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(textwrap.dedent(f"""
        model: {{path: {DEMO_MODEL}, device: cpu}}
        task: {{name: arithmetic, train_size: 16, eval_size: 6}}
        prompts_per_step: 2
        grpo: {{group_size: 4, batch_size: 8}}
        policy: {{generation: {{max_new_tokens: 4}}}}
        schedule: {{num_steps: 3, learning_rate: 0.05}}
        evaluation: {{modes: [greedy], every: 2}}
        run: {{threads: 1, dir: {run}, checkpoint_every: 1, keep_checkpoints: 10}}
    """))
    assert grpo(["train", str(config)]) == 0
    return run


def test_checkpoints_score_what_the_run_logged_and_join_the_curve(tmp_path, capsys):
    run = _train(tmp_path)
    evaluate_checkpoints.main([str(run), "--steps", "1", "2"])
    evaluate_checkpoints.main([str(run)])  # 1 and 2 are done: only 3 is evaluated
    rows = [json.loads(line) for line in (run / "checkpoint_evals.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    in_run = {r["step"]: r for r in logged if "eval/greedy/accuracy" in r}
    assert sorted(in_run) == [0, 2, 3]
    changed = ("eval/greedy/length_mean", "eval/greedy/accuracy")
    assert all(in_run[0][k] != in_run[3][k] for k in changed)  # the starting model would not pass
    for row in rows[1:]:  # steps 2 and 3 were also evaluated inside the run: same numbers
        assert {k: v for k, v in in_run[row["step"]].items() if k in row} == row
    steps, evaluations = run_curve.read(run)
    assert [e["step"] for e in evaluations] == [0, 1, 2, 3]
    assert evaluations[1]["eval/greedy/accuracy"] == rows[0]["eval/greedy/accuracy"]
    assert evaluations[1]["seconds"] == steps[0]["seconds"] == steps[0]["time/step"]
