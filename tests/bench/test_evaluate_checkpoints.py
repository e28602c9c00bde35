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
    # the starting model would not pass: step 3's evaluation differs from step 0's (in one of
    # these at least: a draw can leave one as it was, the length 3.5 on one CPU)
    changed = ("eval/greedy/length_mean", "eval/greedy/accuracy", "eval/greedy/reward_mean")
    assert any(in_run[0][k] != in_run[3][k] for k in changed)
    for row in rows[1:]:  # steps 2 and 3 were also evaluated inside the run: same numbers
        assert {k: v for k, v in in_run[row["step"]].items() if k in row} == row
    steps, evaluations = run_curve.read(run)
    assert [e["step"] for e in evaluations] == [0, 1, 2, 3]
    assert evaluations[1]["eval/greedy/accuracy"] == rows[0]["eval/greedy/accuracy"]
    assert evaluations[1]["seconds"] == steps[0]["seconds"] == steps[0]["time/step"]


def test_overrides_and_the_starting_model_stand_in_for_the_runs_own_evaluations(tmp_path):
    """Step 0 is the model the run started from; `--set` evaluations are their own rows (a step
    done with other overrides is evaluated again) and replace the run's evaluation in the curve."""
    run = _train(tmp_path)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in logged if r["step"] == 0 and "eval/greedy/accuracy" in r)
    evaluate_checkpoints.main([str(run), "--steps", "0", "3"])
    evaluate_checkpoints.main([str(run), "--steps", "0", "3", "--set", "task.eval_size=2"])
    rows = [json.loads(line) for line in (run / "checkpoint_evals.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("overrides")) for r in rows] == [
        (0, None), (3, None), (0, ["task.eval_size=2"]), (3, ["task.eval_size=2"])
    ]
    assert {k: v for k, v in start.items() if k in rows[0]} == rows[0]  # the untrained model
    two = [r["eval/greedy/accuracy"] * 2 for r in rows[2:]]  # accuracies over 2 problems
    assert two == [round(x) for x in two] and rows[2] != rows[0]
    _, evaluations = run_curve.read(run)
    by_step = {e["step"]: e for e in evaluations}
    assert by_step[0]["overrides"] == by_step[3]["overrides"] == ["task.eval_size=2"]
    assert by_step[0]["seconds"] == 0.0
