"""Rollouts from running `vllm serve` processes, with the trainer's weights published to them.

    rollout: {engine: vllm_server, server: {urls: [http://127.0.0.1:8000]}}

The servers are started by the user (docs/vllm.md, "vLLM servers", has the
command); this engine only talks to them over HTTP (`vllm_client.py`):

- At connect, each server must serve the expected model (`/v1/models`), with a
  maximum length no longer than the trainer's context, the same tokenizer (a
  fixed text tokenised by `/tokenize` gives the trainer's ids), processed
  log-probs and no checkpoint sampling defaults (`/server_info`), and the
  worker extension `grpo.lm.engines.vllm_worker.WeightReloader`.
- Each rollout first syncs: the trainer's weights are published as a new
  version folder (`vllm_publish.py`), every server reloads it through the
  worker extension (`/collective_rpc`) and resets its prefix cache, then the
  check runs: every server must report that version, and its log-probs of a
  fixed probe sequence must match the trainer's (as for the in-process CPU
  engine, `vllm_cpu.probe_problems`: within a tolerance, and nearer the
  current weights than the previous check's).
- The prompt rows are split into equal contiguous parts, one per server; every
  row is one `/v1/completions` request (token ids in, token ids and log-probs
  out), with its own seed (`request_seeds`, as the in-process engine).

Faults: every call has a timeout; the first failed call (refused, timed out,
an HTTP error) abandons the whole rollout with one `ServerError` naming the
server, the call and what was in flight, and nothing of that rollout is used
(no optimizer step happens). The run stops with its last checkpoint intact;
`grpo train --resume` reconnects, publishes the checkpoint's weights and
redraws the abandoned step's prompts from the checkpointed sampler state.

Under torchrun each rank owns its own servers (`rank_share`): rank r samples
its shard of the step on urls[r::world] and publishes to publish_dir/rank-r,
so no two ranks reload one server (FSDP2 weights are gathered whole first).

Departures from the in-process engine: weights travel through files, not
memory (the file route works wherever the servers can read the folder; vLLM's
NCCL weight transfer, the GPU route, is not built here); servers reload one
after the other.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grpo.lm.engines.base import Samples
from grpo.lm.engines.server_settings import ServerSettings
from grpo.lm.engines.vllm_client import (
    ServerClient,
    ServerError,
    completion_body,
    parse_completion,
    parse_prompt_logprobs,
    probe_body,
)
from grpo.lm.engines.vllm_cpu import (
    probe_ids,
    probe_problems,
    probe_tolerance,
    trainer_probe_logprobs,
)
from grpo.lm.engines.vllm_publish import prune_versions, publish_weights
from grpo.lm.engines.vllm_requests import request_seeds
from grpo.lm.engines.weights import trainer_weights
from grpo.lm.loading import is_peft_model
from grpo.lm.model_setup import context_length
from grpo.lm.sampling import GenerationSettings

__all__ = ["WORKER_EXTENSION", "ServerError", "VLLMServerEngine", "rank_share", "split_rows"]

WORKER_EXTENSION = "grpo.lm.engines.vllm_worker.WeightReloader"
"""The `--worker-extension-cls` every server must run with."""
TOKENIZER_CHECK_TEXT = " 12+34=46\nThe answer is: yes, no. (x) [y] {z} é"
"""Tokenised by the server and the trainer at connect (with the special tokens prepended)."""


def rank_share(urls: list[str], folder: Path) -> tuple[list[str], Path]:
    """The servers and publish folder of this process: all of them in one process; under
    torchrun, rank r owns urls[r::world] and publishes to folder/rank-r (no two ranks reload
    one server)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return urls, folder
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(urls) < world:
        raise ValueError(
            f"rollout.server.urls: got {len(urls)} URL(s) for {world} ranks; allowed: at least "
            "one server per rank (rank r uses urls[r::world])"
        )
    return urls[rank::world], folder / f"rank-{rank}"


def split_rows(n: int, parts: int) -> list[range]:
    """n rows in `parts` contiguous ranges whose sizes differ by at most one."""
    size, extra = divmod(n, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (i < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


class VLLMServerEngine:
    """Sampling on running vLLM servers for `CausalLMPolicy`; `close()` ends the connections."""

    samples_with_scorer = False  # other processes and kernels: π_old is recorded

    def __init__(
        self, model: nn.Module, tokenizer: Any, settings: ServerSettings, tis_cap: float | None
    ) -> None:
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.tis_cap = tis_cap
        self.metrics: dict[str, float] = {}
        """Statistics of the last sync: "rollout/weight_sync_s" (publish, reload, check),
        "rollout/publish_s", "rollout/weight_checks" (checks passed), "rollout/probe_gap"."""
        self.checks = 0
        self.version = ""
        """The weight version every server should hold (set once all reloaded it)."""
        self._count = 0
        self._run = uuid.uuid4().hex[:8]  # versions of this engine never match an older run's
        self._owner = True  # closes the connections and the temporary folder (not a copy)
        self._temporary = (
            None if settings.publish_dir else tempfile.TemporaryDirectory(prefix="grpo-weights-")
        )
        folder = Path(settings.publish_dir or self._temporary.name)  # type: ignore[union-attr]
        urls, self.folder = rank_share(settings.urls, folder)
        key = os.environ.get(settings.api_key_env) or None
        self.clients = [
            ServerClient(
                url, key, settings.timeout_s, settings.connect_timeout_s, settings.max_concurrency
            )
            for url in urls
        ]
        config = (model.get_base_model() if is_peft_model(model) else model).config
        self.context = context_length(model.get_base_model() if is_peft_model(model) else model)
        self.probe = probe_ids(config.vocab_size, self.context)
        self.probe_previous: torch.Tensor | None = None
        self.probe_gap: float | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.served = [self._connect(client) for client in self.clients]
            self.sync()
        except BaseException:
            self.close()
            raise

    def __deepcopy__(self, memo: dict[int, Any]) -> VLLMServerEngine:
        """The engine of a policy copy (the overlapped run's sampler, `grpo.run.overlap`): the
        same servers, connections and folder, the copied model's weights, its own versions.
        Whoever samples syncs its own weights first, so the two take turns on the servers."""
        twin = copy.copy(self)
        memo[id(self)] = twin
        twin.model = copy.deepcopy(self.model, memo)
        twin.metrics, twin.checks, twin._count = {}, 0, 0
        twin._run = uuid.uuid4().hex[:8]  # its versions never share a label with this engine's
        twin._temporary = None  # the folder stays this engine's to clean up
        twin._owner = False  # and the connections this engine's to close
        return twin

    # ------------------------------------------------------------ connect
    def _connect(self, client: ServerClient) -> dict[str, Any]:
        """Check one server against the trainer; returns its model name, length and dtype."""
        models = client.get("/v1/models", "listing its models")["data"]
        names = [m["id"] for m in models]
        want = self.settings.model
        if (want is None and len(names) != 1) or (want is not None and want not in names):
            raise ServerError(
                f"vLLM server {client.url} serves {names}; expected "
                + (f"{want!r} (rollout.server.model)" if want else "exactly one model")
            )
        served = next(m for m in models if want is None or m["id"] == want)
        max_len = int(served["max_model_len"])
        if self.context is not None and max_len > self.context:
            raise ServerError(
                f"vLLM server {client.url}: max_model_len {max_len} is longer than the "
                f"trainer's context ({self.context}), which could not score such completions; "
                f"start it with --max-model-len {self.context}"
            )
        config = self._server_config(client)
        self._check_tokenizer(client, served["id"])
        dtype = getattr(torch, str(config["model_config"].get("dtype", "")).removeprefix("torch."))
        tolerance = probe_tolerance(dtype, self.settings.probe_tolerance)
        return {"model": served["id"], "max_model_len": max_len, "tolerance": tolerance}

    def _server_config(self, client: ServerClient) -> dict[str, Any]:
        """The server's vLLM config (`/server_info`, dev mode), checked for what this engine needs."""
        try:
            info = client.get("/server_info", "reading its config", {"config_format": "json"})
        except ServerError as error:
            raise ServerError(
                f"{error}. The engine needs the server's dev endpoints: start it with "
                "VLLM_SERVER_DEV_MODE=1 (docs/vllm.md, vLLM servers)"
            ) from error
        config = info["vllm_config"]
        model, parallel = config["model_config"], config["parallel_config"]
        processed = model.get("logprobs_mode") == "processed_logprobs"
        wanted = {
            "--logprobs-mode processed_logprobs": processed,
            "--generation-config vllm": model.get("generation_config") == "vllm",
            f"--worker-extension-cls {WORKER_EXTENSION}": (
                parallel.get("worker_extension_cls") == WORKER_EXTENSION
            ),
        }
        missing = [flag for flag, ok in wanted.items() if not ok]
        if missing:
            raise ServerError(
                f"vLLM server {client.url} runs without {', '.join(missing)}; restart it with "
                "them (docs/vllm.md, vLLM servers)"
            )
        return config

    def _check_tokenizer(self, client: ServerClient, model: str) -> None:
        text = "".join(self.tokenizer.all_special_tokens) + TOKENIZER_CHECK_TEXT
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        theirs = client.post("/tokenize", body, "tokenising the tokenizer check")["tokens"]
        ours = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if list(theirs) != list(ours):
            raise ServerError(
                f"vLLM server {client.url} tokenises {text!r} as {theirs}, the trainer as "
                f"{ours}: it serves another tokenizer; start it on the trainer's model folder"
            )

    # ------------------------------------------------------------ rollouts
    def sample(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        """Sample new tokens for every row on the servers, after syncing the trainer's weights."""
        longest = max((len(row) for row in prompt_rows), default=0) + settings.max_new_tokens
        limit = min(s["max_model_len"] for s in self.served)
        if longest > limit:
            raise ValueError(
                f"a prompt of {longest - settings.max_new_tokens} tokens + max_new_tokens "
                f"{settings.max_new_tokens} exceeds the servers' max_model_len ({limit})"
            )
        self.sync()  # the trainer may have stepped since the last rollout
        seeds = request_seeds(seed, len(prompt_rows))
        results: list[tuple[list[int], list[float]] | None] = [None] * len(prompt_rows)
        shards = split_rows(len(prompt_rows), len(self.clients))
        pools = [ThreadPoolExecutor(self.settings.max_concurrency) for _ in self.clients]
        futures: dict[Future, tuple[int, int]] = {}
        try:
            for s, (client, rows, pool) in enumerate(zip(self.clients, shards, pools, strict=True)):
                what = (
                    f"sampling prompt rows {rows.start}-{rows.stop - 1} of a "
                    f"{len(prompt_rows)}-row rollout (weights version {self.version})"
                )
                for i in rows:
                    body = completion_body(
                        self.served[s]["model"], prompt_rows[i], settings, eos_ids, seeds[i]
                    )
                    futures[pool.submit(self._complete, client, body, what)] = (s, i)
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is None:
                    results[futures[future][1]] = future.result()
            for future in done:
                if future.exception() is not None:
                    raise self._abandoned(future.exception(), futures, shards, futures[future][0])
        finally:
            for pool in pools:  # calls still running end within the timeout; queued ones drop
                pool.shutdown(wait=False, cancel_futures=True)
        return Samples([r[0] for r in results], [r[1] for r in results])  # type: ignore[index]

    @staticmethod
    def _complete(client: ServerClient, body: dict[str, Any], what: str):
        answer = client.post("/v1/completions", body, what)
        try:
            return parse_completion(answer)
        except ValueError as error:
            raise ServerError(f"vLLM server {client.url} while {what}: {error}") from error

    def _abandoned(
        self, error: BaseException, futures: dict[Future, tuple[int, int]], shards, s: int
    ) -> BaseException:
        """The error that ends a rollout: the failure, with how far that server had got."""
        if not isinstance(error, ServerError):
            return error
        finished = sum(
            1 for f, (t, _) in futures.items() if t == s and f.done() and f.exception() is None
        )
        return ServerError(
            f"{error}; {finished} of the {len(shards[s])} rows sent to it had finished. The "
            "rollout is abandoned (no update used it); a run stops here with its last "
            "checkpoint intact: continue with grpo train --resume once the server is back"
        )

    # ------------------------------------------------------------ weights
    def sync(self) -> None:
        """Publish the trainer's current weights as a new version, reload it on every server,
        reset their prefix caches, then check."""
        start = time.perf_counter()
        self._count += 1
        label = f"{self._run}-{self._count:06d}"
        path = publish_weights(self.folder, label, trainer_weights(self.model))
        published = time.perf_counter()
        for client in self.clients:
            what = f"reloading weights version {label} from {path}"
            held = {r.get("version") for r in client.rpc("grpo_reload", [str(path), label], what)}
            if held != {label}:
                raise ServerError(f"vLLM server {client.url} answered {held} while {what}")
            answer = client.post("/reset_prefix_cache", None, "resetting its prefix cache")
            if isinstance(answer, dict) and answer.get("success") is False:
                raise ServerError(f"vLLM server {client.url} refused to reset its prefix cache")
        self.version = label
        self.check()
        prune_versions(self.folder, self.settings.keep_versions)
        self.metrics = {
            "rollout/weight_sync_s": time.perf_counter() - start,
            "rollout/publish_s": published - start,
            "rollout/weight_checks": float(self.checks),
        }
        if self.probe_gap is not None:
            self.metrics["rollout/probe_gap"] = self.probe_gap

    def check(self) -> None:
        """Raise RuntimeError unless every server holds `self.version` and computes with the
        trainer's current weights (the probe)."""
        problems = []
        for client in self.clients:
            results = client.rpc("grpo_version", [], "reporting its weights version")
            held = {r.get("version") for r in results}
            if held != {self.version}:
                problems.append(
                    f"{client.url} holds weights version {sorted(held)}, not {self.version!r}"
                )
        trainer = trainer_probe_logprobs(self.model, self.probe)
        gaps = []
        for client, served in zip(self.clients, self.served, strict=True):
            body = probe_body(served["model"], self.probe)
            answer = client.post("/v1/completions", body, "scoring the weight probe")
            engine = torch.tensor(parse_prompt_logprobs(answer, self.probe))
            gaps.append(float((trainer - engine).abs().max()))
            found = probe_problems(engine, trainer, self.probe_previous, served["tolerance"])
            problems += [f"{client.url}: {p}" for p in found]
        self.probe_gap = max(gaps)
        if problems:
            raise RuntimeError(
                "the vLLM servers do not hold the trainer's weights: " + "; ".join(problems)
            )
        self.probe_previous = trainer
        self.checks += 1

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close the connections and a temporary publish folder (the servers keep running, and
        a configured publish_dir keeps its newest versions). Safe to call twice; a copy's
        close leaves both to the engine it was copied from."""
        if not self._owner:
            return
        for client in getattr(self, "clients", []):
            client.close()
        if self._temporary is not None:
            self._temporary.cleanup()

    def __enter__(self) -> VLLMServerEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
