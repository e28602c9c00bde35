"""`rollout.engine: vllm_server` against a stand-in server (tests/lm/engines/fake_vllm_server.py):
when weights are published, the publish root, and answers that did not finish. The real
server's tests are in test_vllm_server.py (`make test-vllm`)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.cli import main
from grpo.lm.engines import ServerSettings
from grpo.lm.engines.vllm_server import ServerError, VLLMServerEngine
from grpo.lm.sampling import GenerationSettings

from .fake_vllm_server import FakeServer, serve

REPO = Path(__file__).resolve().parents[3]
DEMO_MODEL = REPO / "grpo" / "assets" / "arith-tiny"
URL = "http://10.0.0.9:8000"
PROMPTS = ["12+34=", "5+7=", "40+41="]


def _model():
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(DEMO_MODEL)


@pytest.fixture
def server(monkeypatch, tmp_path):
    """One stand-in server on the demo model, publish root tmp_path/root."""
    model, tokenizer = _model()
    (tmp_path / "root").mkdir()
    fake = FakeServer(model, tokenizer, tmp_path / "root")
    serve(monkeypatch, {URL: fake})
    return fake


def _engine(**kw) -> VLLMServerEngine:
    model, tokenizer = _model()
    return VLLMServerEngine(model, tokenizer, ServerSettings(urls=[URL], **kw), None)


def test_unchanged_weights_are_published_once_and_checked_every_rollout(server):
    """Three rollouts on unchanged weights publish nothing after the build's version but pass
    the probe each time; an optimizer step, or a write through `.data` (which autograd's
    version counter misses), makes the next rollout publish exactly one new version."""
    with _engine() as engine:
        rows = [engine.tokenizer(p)["input_ids"] for p in PROMPTS]
        settings = GenerationSettings(max_new_tokens=3, do_sample=False)
        eos = [engine.tokenizer.eos_token_id]
        for _ in range(3):
            engine.sample(rows, settings, eos, seed=0)
        assert (server.calls["grpo_reload"], engine.loaded.loads, engine.checks) == (1, 1, 4)
        assert engine.metrics["rollout/publish_s"] == 0.0
        optimizer = torch.optim.AdamW(engine.model.parameters(), lr=1e-3)
        engine.model(input_ids=torch.tensor([rows[0]])).logits.sum().backward()
        optimizer.step()
        engine.sample(rows, settings, eos, seed=0)
        engine.sample(rows, settings, eos, seed=0)
        assert (server.calls["grpo_reload"], engine.loaded.loads, engine.checks) == (2, 2, 6)
        engine.model.lm_head.weight.data.mul_(1.01)  # leaves the version counter alone
        engine.sample(rows, settings, eos, seed=0)
        assert (server.calls["grpo_reload"], engine.checks) == (3, 7)
        assert engine.metrics["rollout/weight_loads"] == 3.0
        assert engine.probe_gap < 1e-5  # the server computes with the trainer's weights


def test_a_server_reloaded_by_another_engine_gets_this_engines_weights_again(server):
    """An engine whose servers now hold another engine's version (the overlapped run's copy)
    publishes again although its own weights did not change."""
    import copy

    with _engine() as engine:
        twin = copy.deepcopy(engine)
        with torch.no_grad():
            twin.model.lm_head.weight.mul_(1.01)
        twin.sync()
        assert server.worker.grpo_version()["version"] == twin.version != engine.version
        engine.sync()
        assert server.worker.grpo_version()["version"] == engine.version
        assert server.calls["grpo_reload"] == 3 and engine.probe_gap < 1e-5


@pytest.mark.parametrize("overlap", [0, 1])
def test_a_run_publishes_once_per_weight_version_not_per_evaluation_batch(
    server, tmp_path, monkeypatch, overlap
):
    """`grpo train` with an evaluation (two batches) after every step: the build publishes once,
    then each optimizer step's weights once (at the first rollout that uses them), never an
    unchanged version for an evaluation batch; the overlapped run's sampler copy publishes the
    version each step samples with."""
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    sets = [
        "rollout.engine=vllm_server", f"rollout.server.urls=[{URL}]",
        f"run.max_staleness={overlap}", "prompts_per_step=4", "grpo.group_size=4",
        "grpo.batch_size=16", "policy.micro_batch_size=16", "schedule.num_steps=3",
        "schedule.warmup_steps=0", "task.eval_size=4", "evaluation.every=1",
        "evaluation.batch_size=2", "run.checkpoint_every=0", "run.tensorboard=false",
        "run.threads=1", f"run.dir={run_dir}",
    ]  # fmt: skip
    assert main(["train", "configs/demo.yaml", *[a for s in sets for a in ("--set", s)]]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    updates = sum("loss/policy" in r for r in steps)  # optimizer steps (equal rewards: none)
    assert len(steps) == 3 and updates >= 1
    evaluations = [r for r in rows if "time/eval" in r]
    assert len(evaluations) == 4  # before the first step, after each
    # no version is published while the server holds the same engine's identical weights
    reloads = [(label.split("-")[0], digest) for label, digest in server.reloads]  # (run, weights)
    assert all(a != b for a, b in zip(reloads, reloads[1:], strict=False))
    if overlap == 0:  # build + one per update; old behaviour: one per rollout, 1 + 3 + 4 * 2
        assert server.calls["grpo_reload"] == 1 + updates
    else:  # the sampler's copy: at most one per step; the trainer's: build + one per evaluation
        assert server.calls["grpo_reload"] <= 1 + 3 + 4
        assert 1 <= steps[-1]["rollout/weight_loads"] <= 3


def test_an_aborted_or_cut_answer_is_an_error_naming_the_server_and_row(server):
    """finish_reason "abort", or "length" before max_new_tokens, fails the rollout with a
    ServerError naming the server, the row and the reason: never a short "finished" completion."""
    with _engine() as engine:
        rows = [engine.tokenizer(p)["input_ids"] for p in PROMPTS]
        settings = GenerationSettings(max_new_tokens=4, do_sample=False)
        eos = [engine.tokenizer.eos_token_id]
        engine.settings.max_concurrency = 1
        for reason, kept, message in [
            ("abort", 1, "finish_reason 'abort' after 1 tokens"),
            ("length", 2, "finish_reason 'length' after 2 tokens, not max_tokens 4"),
        ]:
            server.finish = {tuple(rows[1]): (reason, kept)}
            with pytest.raises(ServerError) as caught:
                engine.sample(rows, settings, eos, seed=0)
            text = str(caught.value)
            assert URL in text and message in text and "prompt row" in text, text
        server.finish = {}
        assert len(engine.sample(rows, settings, eos, seed=0).token_ids) == 3


def test_the_publish_folder_must_lie_in_every_servers_root(server, tmp_path, monkeypatch):
    """Without publish_dir the versions go to a temporary folder inside the server's root (gone
    at close); a publish_dir outside it, or a server started without a root, is refused at
    connect with an error naming the server and GRPO_PUBLISH_ROOT."""
    with _engine() as engine:
        folder = engine.folder
        assert folder.parent == tmp_path / "root" and any(folder.glob("weights-*"))
    assert not folder.exists()
    with pytest.raises(ServerError, match=f"vLLM server {URL}: the trainer publishes into"):
        _engine(publish_dir=str(tmp_path / "elsewhere"))
    assert not (tmp_path / "elsewhere").exists()  # refused before anything was written
    with _engine(publish_dir=str(tmp_path / "root" / "run-1")) as engine:
        assert engine.folder == tmp_path / "root" / "run-1"
    server.root = None
    with pytest.raises(ServerError, match="no single publish root .* GRPO_PUBLISH_ROOT"):
        _engine()
