"""Bad inputs through `grpo train` with the `prompts` task: each is one clear line, exit status 2.

Data and reward-function errors that can be found without a model are found
before it loads; a prompt too long for the model before the first step; a
reward function that returns a wrong value or raises when it runs, with the
function, the sample and its file line named. No error loses a checkpoint:
a run stopped at step 3 resumes once its data are fixed and ends where an
uninterrupted run ends. Runs are in-process on the shipped demo model.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo.cli import main
from grpo.run.loop import StateSampler
from grpo.run.rundir import RunDirectory

DEMO_MODEL = Path(__file__).resolve().parents[2] / "grpo" / "assets" / "arith-tiny"
ROWS = [{"prompt": f"{i}+4=", "answer": str(i + 4)} for i in range(6)]
MEASURED = ("time/", "throughput/", "memory/")  # wall time and memory: never reproducible

REWARDS = """
def correct(prompts, completions, answer):
    return [float(c.strip() == str(int(a))) for c, a in zip(completions, answer)]

def length(prompts, completions, **columns):
    return [len(c) / 3 for c in completions]

def short(prompts, completions, **columns):
    return [0.0] * (len(completions) - 1)

def strings(prompts, completions, **columns):
    return ["1.0" for _ in completions]

def nan(prompts, completions, **columns):
    return [float("nan") for _ in completions]

def none(prompts, completions, **columns):
    return [None for _ in completions]

def raises(prompts, completions, **columns):
    return [1.0 / (p != "3+4=") for p in prompts]

def one_argument(completions):
    return [0.0 for _ in completions]

NOT_A_FUNCTION = 3
"""
RAISES_AT = 1 + REWARDS.splitlines().index('    return [1.0 / (p != "3+4=") for p in prompts]')


def jsonl(rows: list) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def write_run(tmp: Path, train: str, reward: str = "correct", **task) -> tuple[list[str], Path]:
    """`grpo train` arguments for a 4-step run on `train` (JSONL text); its run folder."""
    (tmp / "rewards.py").write_text(REWARDS)
    (tmp / "train.jsonl").write_text(train)
    spec = reward if ":" in reward else f"{tmp / 'rewards.py'}:{reward}"
    task = {"name": "prompts", "train_file": str(tmp / "train.jsonl"),
            "rewards": [{"function": spec}], **task}  # fmt: skip
    (tmp / "run.yaml").write_text(textwrap.dedent(f"""
        model: {{path: {DEMO_MODEL}, device: cpu}}
        task: {json.dumps(task)}
        prompts_per_step: 2
        grpo: {{group_size: 2, batch_size: 4}}
        policy: {{generation: {{max_new_tokens: 3}}}}
        schedule: {{num_steps: 4, learning_rate: 1.0e-3}}
        run: {{threads: 1, checkpoint_every: 1, log_every: 100, dir: {tmp / 'run'}}}
    """))  # fmt: skip
    return ["train", str(tmp / "run.yaml")], tmp / "run"


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("grpo train: error: "), err
    assert "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails the test: these errors must come before it."""

    def refuse(config):
        raise AssertionError("the model was loaded before the bad input was found")

    monkeypatch.setattr("grpo.cli.tasks.load_policy", refuse)


@pytest.mark.parametrize(
    ("rows", "reward", "task", "message"),
    [
        (ROWS + ['{"prompt": '], "correct", {}, "line 7 of '.*train.jsonl' is not valid JSON"),
        (ROWS + ["[1, 2]"], "correct", {}, "line 7 of .*: got list \\[1, 2\\]; allowed: a JSON object"),
        (ROWS[:2] + ["", {"question": "x"}], "correct", {}, "line 4 of .*: no 'prompt' key"),
        (ROWS + [{"prompt": " "}], "correct", {}, "line 7 of .*: the prompt is empty"),
        ([""], "correct", {}, "train prompts is empty: '.*train.jsonl' holds no rows"),
        (ROWS + [{"prompt": "1+1="}], "correct", {}, "line 7 of .*: no column 'answer', which "
         "reward function 'correct' requires \\(the row has \\['prompt'\\]\\)"),
        (ROWS + [{"prompt": "1+1=", "completions": 2}], "length", {},
         "line 7 of .*: column 'completions' clashes with a reward argument"),
        (ROWS, "length", {"accuracy": "{tmp}/rewards.py:correct", "eval_file": "{tmp}/eval.jsonl"},
         "held-out prompts line 1 of .*: no column 'answer', which reward function 'correct'"),
        (ROWS, "one_argument", {}, "task.rewards\\[0\\].function: .*'one_argument' cannot be "
         "called as one_argument\\(prompts, completions, \\*\\*columns\\)"),
        (ROWS, "NOT_A_FUNCTION", {}, "task.rewards\\[0\\].function: .*got int; allowed: a callable"),
        (ROWS, "{tmp}/broken.py:x", {}, "task.rewards\\[0\\].function: cannot import .*"
         "SyntaxError: invalid syntax \\(broken.py, line 1\\)"),
    ],
)  # fmt: skip
def test_bad_data_and_reward_functions_fail_before_the_model_loads(
    tmp_path, capsys, no_model, rows, reward, task, message
):
    """Bad rows, missing columns and unusable reward functions: one line naming them, no folder."""
    (tmp_path / "broken.py").write_text("def x(:\n")
    (tmp_path / "eval.jsonl").write_text(jsonl([{"prompt": "1+1="}]))
    here = str(tmp_path)
    task = {key: value.replace("{tmp}", here) for key, value in task.items()}
    args, run = write_run(tmp_path, jsonl(rows), reward.replace("{tmp}", here), **task)
    assert main(args) == 2
    assert re.search(message, error_line(capsys))
    assert not run.exists()  # no folder to clear: the same command runs once the data are fixed


def test_a_prompt_longer_than_the_context_fails_before_the_first_step(tmp_path, capsys):
    """A prompt that cannot fit the model's context is named by its file line, before step 1."""
    args, run = write_run(tmp_path, jsonl(ROWS + [{"prompt": "1+" * 40, "answer": "1"}]))
    assert main(args) == 2
    line = error_line(capsys)
    assert re.search("train prompts line 7 of .*: prompt of 81 tokens \\+ max_new_tokens=3 "
                     "exceeds the model's context of 64 tokens", line)  # fmt: skip
    assert not run.exists()


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("short", "reward function 'short' returned 3 values for 4 samples"),
        ("strings", "reward function 'strings' returned str '1.0' for sample 0 \\(prompt '.*', "
         "train prompts line [1-4] of '.*train.jsonl'\\); allowed: a number or None"),
        ("nan", "reward function 'nan' returned nan for sample 0 .*; rewards must be finite"),
        ("none", "every reward function returned None for sample 0"),
        ("raises", "reward function 'raises' raised on sample 0 \\(prompt '3\\+4=', train prompts "
         "line [1-4] of .*\\): ZeroDivisionError: float division by zero at "
         f".*rewards.py:{RAISES_AT}\\."),
    ],
)  # fmt: skip
def test_a_reward_that_breaks_the_contract_stops_the_run_cleanly(tmp_path, capsys, reward, message):
    """A wrong length, a string, NaN, no value or an exception: one line naming the function."""
    args, run = write_run(tmp_path, jsonl([ROWS[3]] * 4), reward)  # every prompt is "3+4="
    assert main(args) == 2
    line = error_line(capsys)
    assert re.search(message, line), line
    assert re.search("The run stopped after 0 completed steps; no checkpoint was written yet, "
                     f"so a resumed run starts over.*grpo train --resume {run}$", line)  # fmt: skip
    assert not list((run / "checkpoints").glob("*"))
    assert (run / "metrics.jsonl").read_text() == ""


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in row.items() if not k.startswith(MEASURED)} for row in rows]
    return [row for row in rows if set(row) != {"step"}]  # a checkpoint's time: measured only


def test_a_run_stopped_at_step_3_by_a_bad_row_resumes_once_the_row_is_fixed(tmp_path, capsys):
    """Checkpoints 1 and 2 survive the failure; resumed, the run ends as an unbroken one would."""
    sampler = StateSampler(list(range(len(ROWS))), 2, seed=0)  # the run's sampler (seed 0)
    bad = [next(sampler) for _ in range(3)][2][0]  # a row first drawn at step 3
    rows = [dict(r) for r in ROWS]
    rows[bad]["answer"] = "n/a"  # int("n/a") raises inside the reward function
    (tmp_path / "a").mkdir()
    args, run = write_run(tmp_path / "a", jsonl(rows))
    assert main(args) == 2
    line = error_line(capsys)
    assert re.search(f"reward function 'correct' raised on sample [01] \\(prompt '{bad}\\+4=', "
                     f"train prompts line {bad + 1} of .*\\): ValueError: invalid literal for int",
                     line), line  # fmt: skip
    assert "stopped after 2 completed steps; its checkpoint of step 2 is intact" in line
    kept = RunDirectory(run)
    assert kept.complete_steps() == [1, 2] and kept.verify(1) is None and kept.verify(2) is None
    assert [r["step"] for r in metrics(run)] == [1, 2]

    rows[bad]["answer"] = ROWS[bad]["answer"]  # the data fixed in place
    (tmp_path / "a" / "train.jsonl").write_text(jsonl(rows))
    assert main(["train", "--resume", str(run)]) == 0
    (tmp_path / "b").mkdir()
    args, unbroken = write_run(tmp_path / "b", jsonl(ROWS))
    assert main(args) == 0
    assert metrics(run) == metrics(unbroken)
    first = load_file(run / "final" / "model.safetensors")
    second = load_file(unbroken / "final" / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_the_start(tmp_path, capsys):
    """Fixed and resumed with no checkpoint, the run starts over: one step-0 evaluation, 4 steps."""
    (tmp_path / "eval.jsonl").write_text(jsonl(ROWS[:2]))  # no "3+4=": evaluated without error
    args, run = write_run(tmp_path, jsonl([ROWS[3]] * 4), "raises",
                          eval_file=str(tmp_path / "eval.jsonl"))  # fmt: skip
    args += ["--set", "evaluation.modes=[greedy]"]
    assert main(args) == 2
    line = error_line(capsys)
    assert (
        "stopped after 0 completed steps; no checkpoint was written yet, so a resumed run" in line
    )
    assert [r["step"] for r in metrics(run)] == [0]  # the evaluation before step 1
    fixed = REWARDS.replace('1.0 / (p != "3+4=")', "1.0")
    (tmp_path / "rewards.py").write_text(fixed)  # the reward function fixed
    assert main(["train", "--resume", str(run)]) == 0
    steps = [(r["step"], "eval/greedy/reward_mean" in r) for r in metrics(run)]
    assert steps == [(0, True), (1, False), (2, False), (3, False), (4, False), (4, True)]
