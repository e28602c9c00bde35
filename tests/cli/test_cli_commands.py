"""Tests for the other commands (eval, sample, presets) and for every preset and task running a step."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.cli.tasks import build_task
from grpo.run.config_files import load_config
from grpo.run.presets import PRESETS
from grpo.run.train import build_loop, seed_everything

DEMO_MODEL = Path(__file__).resolve().parents[2] / "grpo" / "assets" / "arith-tiny"

TINY = f"""
model: {{path: {DEMO_MODEL}, device: cpu}}
task: {{name: arithmetic, train_size: 16, eval_size: 6}}
prompts_per_step: 2
grpo: {{group_size: 4, batch_size: 8}}
policy: {{generation: {{max_new_tokens: 4}}}}
schedule: {{num_steps: 1}}
evaluation: {{modes: [greedy]}}
run: {{threads: 1}}
"""


def write(tmp_path: Path, text: str = TINY) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """A tiny random qwen2 with a 512-token context (FEN and game prompts are long in bytes)."""
    from tiny_models import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("wide"), "qwen2", max_positions=512)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_a_trainer_and_runs_one_step(tmp_path, wide_model, name):
    """Each preset's algorithm values train one step with a finite loss (chess on its own task)."""
    overrides = [f"preset={name}"]
    if name == "chess":  # FEN prompts need a longer context than the arithmetic model's
        overrides += [f"model.path={wide_model}", "policy.generation.max_new_tokens=6"]
    config = load_config(write(tmp_path), overrides)
    seed_everything(0, True, 1)
    loop, parts = build_loop(config, build_task)
    metrics = loop.train_step()
    epochs = PRESETS[name].values["grpo"].get("num_epochs_per_update", 1)  # text default: 1
    assert metrics["optimizer_steps"] == epochs and metrics["skipped_steps"] == 0
    assert math.isfinite(metrics["step_loss"]) and math.isfinite(metrics["grad_norm"])
    assert (loop.trainer.reference_policy is not None) == (config.grpo.kl_coeff > 0)
    assert loop.trainer.objective.loss_type == config.grpo.loss_type


def test_guess_number_task_trains_through_the_environment_path(tmp_path, wide_model):
    """The multi-turn task builds episode actions with assistant-only masks and trains a step."""
    config = load_config(write(tmp_path), [
        "task.name=guess_number", f"model.path={wide_model}", "task.eval_size=2",
        "task.options={high: 4, max_guesses: 2}", "policy.generation.max_new_tokens=3",
    ])  # fmt: skip
    seed_everything(0, True, 1)
    loop, parts = build_loop(config, build_task)
    metrics = loop.train_step()
    assert metrics["total_samples"] == 8.0 and metrics["optimizer_steps"] == 1
    episodes = parts.policy.generate_actions(parts.train_states[:1], 2)[0]
    assert all(1 <= e.turns <= 2 for e in episodes)
    evaluation, _ = parts.evaluate()
    assert 0.0 <= evaluation["eval/greedy/solve_rate"] <= 1.0
    assert evaluation["eval/greedy/num_games"] == 2.0


def test_eval_sample_and_presets_commands(tmp_path, capsys):
    """`grpo eval` prints held-out metrics, `grpo sample` completions, `grpo presets` every preset."""
    path = write(tmp_path)
    assert main(["eval", path]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("eval/greedy/accuracy")
    assert main(["sample", path, "--prompt", "12+7=", "-n", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "prompt: '12+7='" and len(out) == 3 and out[1].startswith("  -> ")
    assert main(["sample", path, "--num-prompts", "2", "--greedy"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}:" in out for name in PRESETS)


def test_eval_of_a_missing_model_is_one_clear_line(tmp_path, capsys):
    """--model pointing nowhere is rejected as a config error naming model.path."""
    assert main(["eval", write(tmp_path), "--model", str(tmp_path / "none")]) == 2
    assert "model.path" in capsys.readouterr().err


def test_eval_of_a_checkpoint_reproduces_the_evaluation_logged_at_its_step(tmp_path, capsys):
    """`grpo eval --model RUN_DIR/checkpoints/step-N` prints the held-out metrics the run logged
    at step N; a corrupt checkpoint is one line naming it."""
    import json

    run = tmp_path / "run"
    text = TINY.replace("num_steps: 1", "num_steps: 2, learning_rate: 0.05")
    text = text.replace("run: {threads: 1}", f"run: {{threads: 1, dir: {run}, checkpoint_every: 1}}")
    path = write(tmp_path, text.replace("evaluation: {modes: [greedy]}",
                                        "evaluation: {modes: [greedy], every: 1}"))  # fmt: skip
    assert main(["train", path]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {row["step"]: row for row in rows if "eval/greedy/reward_mean" in row}
    assert logged[1]["eval/greedy/reward_mean"] != logged[0]["eval/greedy/reward_mean"]
    capsys.readouterr()
    assert main(["eval", path, "--model", str(run / "checkpoints" / "step-000001")]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines()
                   if line.startswith("eval/greedy/"))  # fmt: skip
    assert printed["eval/greedy/reward_mean"] == f"{logged[1]['eval/greedy/reward_mean']:.4f}"
    assert printed["eval/greedy/accuracy"] == f"{logged[1]['eval/greedy/accuracy']:.4f}"
    state = run / "checkpoints" / "step-000002" / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    assert main(["eval", path, "--model", str(state.parent)]) == 2
    err = capsys.readouterr().err
    assert "step-000002" in err and "corrupt" in err
