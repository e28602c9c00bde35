"""`rollout.engine: vllm_server` against a real `vllm serve` process (vLLM's CPU build).

Run by `make test-vllm` (marker `vllm`). One server for the module, started on
loopback on a free port (dev mode, an API key, a publish root) on a copy of the demo model,
grpo/assets/arith-tiny: tests/tiny_models.py's models have a head size of 8,
which vLLM's CPU attention refuses ("Unsupported CPU attention configuration:
head_dim=8"). The last test kills it and starts a second one.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from vllm_marks import VLLM_CPU

from grpo.cli import main
from grpo.lm.engines import ServerSettings, VLLMSettings
from grpo.lm.engines.vllm import VLLMEngine
from grpo.lm.engines.vllm_server import WORKER_EXTENSION, ServerError, VLLMServerEngine
from grpo.lm.engines.vllm_worker import ROOT_ENV
from grpo.lm.sampling import GenerationSettings

pytestmark = VLLM_CPU

REPO = Path(__file__).resolve().parents[3]
DEMO_MODEL = REPO / "grpo" / "assets" / "arith-tiny"
KEY_ENV, KEY = "GRPO_TEST_VLLM_KEY", "test-key"
STARTUP_S = int(os.environ.get("GRPO_VLLM_SERVER_STARTUP_S", 420))  # 60-100 s measured, idle
PROMPTS = ["12+34=", "5+7=", "40+41=", "9+9="]
OVERLAP_STEPS, OVERLAP_GAIN = 120, 0.10  # measured: see the test's run in docs/experiments/2026-12-overlapped-rollouts.md


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `vllm serve` process (the CPU build) in its own process group."""

    def __init__(self, model: Path, port: int, log: Path, root: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_API_KEY": KEY,
            ROOT_ENV: str(root),  # the only folder its worker extension reloads from
            "PYTHONPATH": str(REPO),  # the worker extension is imported from this checkout
        }
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its usual processes
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", WORKER_EXTENSION,
            "--kv-cache-memory-bytes", str(1 << 26), "--max-num-seqs", "64",
        ]  # fmt: skip
        self.log_path, self.log = log, log.open("w")
        self.process = subprocess.Popen(
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.process.returncode}); see {log}")
            try:
                headers = {"Authorization": f"Bearer {KEY}"}
                if httpx.get(f"{self.url}/v1/models", headers=headers, timeout=2).is_success:
                    # the first /server_info collects the machine's environment (slow, then
                    # cached): done here, so that the engines' 30 s timeout measures the server
                    httpx.get(f"{self.url}/server_info", headers=headers, timeout=STARTUP_S)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve did not answer within {STARTUP_S} s; see {log}")

    @contextmanager
    def explains_failures(self, lines: int = 60):
        """On an exception inside, print the server log's last lines but its access log (shown
        with the failure)."""
        try:
            yield
        except BaseException:  # the server writes the log; this process holds nothing unwritten
            text = self.log_path.read_text(errors="replace").splitlines()
            tail = [line for line in text if '" 200 OK' not in line][-lines:]
            state = (
                "running" if self.process.poll() is None else f"exited {self.process.returncode}"
            )
            print(f"--- {self.url} ({state}), last {lines} lines of its log:", *tail, sep="\n")
            raise

    def signal(self, sig: int) -> None:
        os.killpg(self.process.pid, sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("served") / "arith-tiny"
    shutil.copytree(DEMO_MODEL, path)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The servers' publish root (GRPO_PUBLISH_ROOT)."""
    return tmp_path_factory.mktemp("publish-root")


@pytest.fixture(scope="module")
def servers(model_dir, root, tmp_path_factory):
    """start(port=None) -> a running Server; the first is started here, all stopped at the end."""
    logs = tmp_path_factory.mktemp("logs")
    started: list[Server] = []

    def start(port: int | None = None) -> Server:
        log = logs / f"{len(started)}.log"
        started.append(Server(model_dir, port or _free_port(), log, root))
        return started[-1]

    old = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = KEY
    try:
        start()
        yield start, started
    finally:
        for server in started:
            server.stop()
        if old is None:
            os.environ.pop(KEY_ENV)
        else:
            os.environ[KEY_ENV] = old


def _model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(DEMO_MODEL)


def _settings(urls, **kw) -> ServerSettings:
    return ServerSettings(urls=urls, api_key_env=KEY_ENV, timeout_s=30, **kw)


def test_server_samples_equal_the_in_process_engine(servers):
    """Greedy and seeded samples (ids and log-probs) from the server, one or split over two URLs,
    equal the in-process vLLM engine's."""
    url = servers[1][0].url
    model, tokenizer = _model()
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(2)]  # (8, prompt)
    eos = [tokenizer.eos_token_id]
    cases = [
        GenerationSettings(max_new_tokens=5, do_sample=False),
        GenerationSettings(max_new_tokens=5, temperature=1.0, top_k=4),
    ]
    with VLLMEngine(
        model, tokenizer, VLLMSettings(engine_kwargs={"kv_cache_memory_bytes": 1 << 26})
    ) as local:
        want = [local.sample(rows, s, eos, seed=3) for s in cases]
    two = [url, url.replace("127.0.0.1", "localhost")]  # one server under two URLs: split rows
    for urls in ([url], two):
        with VLLMServerEngine(model, tokenizer, _settings(urls), None) as engine:
            for settings, expected in zip(cases, want, strict=True):
                got = engine.sample(rows, settings, eos, seed=3)
                assert got.token_ids == expected.token_ids
                gaps = [abs(a - b) for r, s in zip(got.logprobs, expected.logprobs, strict=True)
                        for a, b in zip(r, s, strict=True)]  # fmt: skip
                assert max(gaps) < 1e-5


def test_server_follows_the_trainer_and_a_skipped_sync_is_caught(servers, root):
    """Rollouts on unchanged weights publish no new version; after Adam steps that make one
    token near-certain, the check fails until the next sync, which publishes once; then the
    server samples that token; a server reloaded with an older version fails the check too."""
    url = servers[1][0].url
    model, tokenizer = _model()
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS]
    eos, target = [tokenizer.eos_token_id], tokenizer.convert_tokens_to_ids("7")
    greedy = GenerationSettings(max_new_tokens=3, do_sample=False)
    folder = root / "follows"
    with VLLMServerEngine(
        model, tokenizer, _settings([url], publish_dir=str(folder)), None
    ) as engine:
        for _ in range(2):  # evaluation-like rollouts between two updates: checked, not published
            engine.sample(rows, greedy, eos, seed=0)
        published = len(list(folder.glob("weights-*")))
        assert (engine.loaded.loads, engine.checks, published) == (1, 3, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        ids = torch.tensor([rows[0]])
        for _ in range(20):  # next token after the first prompt -> "7"
            logits = model(input_ids=ids).logits[0, -1]
            loss = torch.nn.functional.cross_entropy(logits[None], torch.tensor([target]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with pytest.raises(RuntimeError, match="do not hold the trainer's weights"):
            engine.check()  # the sync was skipped: the server still has the old weights
        samples = engine.sample(rows[:1] * 4, greedy, eos, seed=0)  # syncs first
        assert engine.loaded.loads == 2
        assert [ids[0] for ids in samples.token_ids] == [target] * 4
        with torch.no_grad():
            p = torch.log_softmax(model(input_ids=ids).logits[0, -1], -1)[target]
        assert abs(samples.logprobs[0][0] - float(p)) < 1e-4
        versions = sorted(folder.glob("weights-*"), key=lambda p: p.stat().st_mtime_ns)
        assert len(versions) == 2  # keep_versions: older ones deleted
        old = versions[0]
        engine.clients[0].rpc("grpo_reload", [str(old), old.name], "a test's stale reload")
        with pytest.raises(RuntimeError, match="holds weights version"):
            engine.check()


def test_the_key_guards_v1_only_and_the_extension_reloads_only_inside_its_root(
    servers, root, model_dir
):
    """Without the API key /v1 is refused (401), but /collective_rpc, /server_info, /tokenize and
    /reset_prefix_cache answer (the network must guard them, docs/vllm.md); grpo_reload of a
    folder outside the publish root (a real model folder, directly or through a link inside the
    root) is refused, and the server keeps the engine's version and weights."""
    server = servers[1][0]
    model, tokenizer = _model()
    assert httpx.get(f"{server.url}/v1/models", timeout=30).status_code == 401
    completion = {"model": "m", "prompt": [1, 2], "max_tokens": 1}
    refused = httpx.post(f"{server.url}/v1/completions", json=completion, timeout=30)
    assert refused.status_code == 401
    unguarded = [
        ("POST", "/collective_rpc", {"method": "grpo_version", "args": []}),
        ("GET", "/server_info", None),
        ("POST", "/tokenize", {"prompt": "1+1="}),
        ("POST", "/reset_prefix_cache", None),
    ]
    for verb, path, body in unguarded:
        answer = httpx.request(verb, f"{server.url}{path}", json=body, timeout=60)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:200])
    link = root / "link-to-model"  # inside the root, pointing outside
    link.symlink_to(model_dir, target_is_directory=True)
    with VLLMServerEngine(model, tokenizer, _settings([server.url]), None) as engine:
        for folder in (model_dir, link):  # the served model's folder: safetensors, loadable
            with pytest.raises(ServerError, match="outside this server's publish root"):
                engine.clients[0].rpc("grpo_reload", [str(folder), "foreign"], "a foreign reload")
        engine.check()  # still the engine's version, computing with the trainer's weights
        assert engine.probe_gap < 1e-4


def test_a_stalled_server_gives_an_error_naming_it_within_the_timeout(servers):
    """A stopped (SIGSTOP) server fails the rollout with a ServerError naming it and the rows in
    flight, within the timeout; once it runs again the engine samples again."""
    server = servers[1][0]
    model, tokenizer = _model()
    rows = [tokenizer(p)["input_ids"] for p in PROMPTS]
    settings = GenerationSettings(max_new_tokens=3, do_sample=False)
    eos = [tokenizer.eos_token_id]
    with VLLMServerEngine(model, tokenizer, _settings([server.url]), None) as engine:
        engine.settings.timeout_s = 5
        for client in engine.clients:
            client.timeout_s, client.http.timeout = 5, httpx.Timeout(5, connect=5)
        engine.sync = lambda: None  # stall the sampling calls, not the reload
        server.signal(signal.SIGSTOP)
        start = time.monotonic()
        try:
            with pytest.raises(ServerError) as caught:
                engine.sample(rows, settings, eos, seed=0)
        finally:
            server.signal(signal.SIGCONT)
        assert time.monotonic() - start < 15
        message = str(caught.value)
        assert server.url in message and "did not answer within" in message
        assert "sampling prompt rows 0-3 of a 4-row rollout" in message
        assert len(engine.sample(rows, settings, eos, seed=0).token_ids) == 4


def test_an_aborted_request_fails_the_rollout_naming_the_server(servers):
    """A request the server aborts (dev mode: /pause keeps it queued, /abort_requests aborts it)
    comes back HTTP 200 with finish_reason "abort" and no tokens: the rollout fails with a
    ServerError naming the server, the row and the reason; resumed, the server samples again."""
    server = servers[1][0]
    model, tokenizer = _model()
    rows = [tokenizer(PROMPTS[0])["input_ids"]]
    settings = GenerationSettings(max_new_tokens=3, do_sample=False)
    eos = [tokenizer.eos_token_id]
    with VLLMServerEngine(model, tokenizer, _settings([server.url]), None) as engine:
        engine.sync = lambda: None  # the probe would wait in the pause too
        assert httpx.post(f"{server.url}/pause", params={"mode": "keep"}, timeout=30).is_success
        try:
            with ThreadPoolExecutor(1) as pool:
                rollout = pool.submit(engine.sample, rows, settings, eos, 0)
                deadline, aborted = time.monotonic() + 30, 0
                while not aborted and time.monotonic() < deadline:
                    time.sleep(0.2)  # until the request has reached the paused engine
                    answer = httpx.post(f"{server.url}/abort_requests", json={}, timeout=30)
                    aborted = answer.json().get("aborted", 0)
                with pytest.raises(ServerError) as caught:
                    rollout.result(timeout=60)
        finally:
            httpx.post(f"{server.url}/resume", timeout=30)
        message = str(caught.value)
        assert server.url in message and "prompt row 0" in message, message
        assert "finish_reason 'abort' after 0 tokens" in message
        del engine.sync
        assert len(engine.sample(rows, settings, eos, seed=0).token_ids[0]) > 0


@pytest.mark.timeout(2400)  # 380 s on 2 cores: room for a machine twice as slow and more
def test_an_overlapped_demo_run_through_the_server_learns(servers, tmp_path, monkeypatch):
    """The demo with run.max_staleness 1 sampling on the server: the sampler's copy of the policy
    publishes the version each step samples with and passes the probe every step, every step
    after the first trains on groups one version old, and held-out greedy accuracy rises."""
    server = servers[1][0]
    monkeypatch.chdir(REPO)
    run_dir = tmp_path / "run"
    sets = [
        "rollout.engine=vllm_server", f"rollout.server.urls=[{server.url}]",
        f"rollout.server.api_key_env={KEY_ENV}", "rollout.server.timeout_s=60",
        "run.max_staleness=1", "run.threads=1", f"schedule.num_steps={OVERLAP_STEPS}",
        "task.eval_size=200", "evaluation.every=0", "run.checkpoint_every=0",
        "run.tensorboard=false", f"run.dir={run_dir}",
    ]  # fmt: skip
    with server.explains_failures():
        assert main(["train", "configs/demo.yaml", *[a for s in sets for a in ("--set", s)]]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "staleness/mean" in r]
    assert len(steps) == OVERLAP_STEPS
    assert [r["staleness/mean"] for r in steps] == [0.0] + [1.0] * (OVERLAP_STEPS - 1)
    # the sampler's engine: one sync and one passed probe per step, with its own weights
    assert [r["rollout/weight_checks"] for r in steps] == list(range(1, OVERLAP_STEPS + 1))
    before, after = (r["eval/greedy/accuracy"] for r in rows if "eval/greedy/accuracy" in r)
    assert after >= before + OVERLAP_GAIN, (before, after)


def test_killed_server_stops_the_run_and_resume_continues(servers, tmp_path, monkeypatch):
    """`grpo train` with the server killed at step 3's rollout: an error naming the server, the
    checkpoint of step 2 intact; with a new server on that port, --resume ends the run, every
    step trained and logged once."""
    start, started = servers
    server = started[0]
    monkeypatch.chdir(REPO)
    run_dir, port = tmp_path / "run", server.url.rsplit(":", 1)[1]
    sets = [
        "rollout.engine=vllm_server", f"rollout.server.urls=[{server.url}]",
        f"rollout.server.api_key_env={KEY_ENV}", "rollout.server.timeout_s=30",
        "prompts_per_step=4", "grpo.group_size=4", "grpo.batch_size=16",
        "policy.micro_batch_size=16", "schedule.num_steps=5", "schedule.warmup_steps=0",
        "task.eval_size=4", "evaluation.every=0", "run.checkpoint_every=1",
        "run.tensorboard=false", f"run.dir={run_dir}",
    ]  # fmt: skip
    original_sync = VLLMServerEngine.sync
    checkpoints = run_dir / "checkpoints"

    def sync_then_kill(engine):
        original_sync(engine)
        if (checkpoints / "step-000002").exists():  # step 3's rollout: weights in, then death
            server.stop()

    monkeypatch.setattr(VLLMServerEngine, "sync", sync_then_kill)
    with pytest.raises(ServerError) as caught:
        main(["train", "configs/demo.yaml", *[a for s in sets for a in ("--set", s)]])
    assert server.url in str(caught.value) and "sampling prompt rows" in str(caught.value)
    assert (checkpoints / "step-000002" / "manifest.json").exists()
    assert not (checkpoints / "step-000003").exists()
    monkeypatch.setattr(VLLMServerEngine, "sync", original_sync)
    start(int(port))
    assert main(["train", "--resume", str(run_dir)]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "reward/mean" in r]  # a step of equal rewards: no loss
    assert steps == [1, 2, 3, 4, 5]
