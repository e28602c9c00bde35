"""Rollouts from running `vllm serve` processes, with the trainer's weights published to them.

    rollout: {engine: vllm_server, server: {urls: [http://127.0.0.1:8000]}}

The servers are started by the user (docs/vllm.md, "vLLM servers", has the
command); this engine only talks to them over HTTP (`vllm_client.py`):

- At connect, each server is checked against the trainer (`vllm_connect.py`:
  model, length, tokenizer, flags, and a publish root holding the trainer's
  publish folder).
- Each rollout first syncs: when the trainer's weights changed since this
  engine last published them (`vllm_cpu.LoadedWeights`), or a server holds
  another version (this engine's copy reloaded it), they are published as a
  new version folder (`vllm_publish.py`), every server reloads it through the
  worker extension (`/collective_rpc`) and resets its prefix cache. Then,
  published or not, the check runs: every server must report that version,
  and its log-probs of a fixed probe sequence must match the trainer's (as for
  the in-process CPU engine, `vllm_cpu.probe_problems`: within a tolerance, and
  nearer the current weights than the previous check's). So the evaluation
  batches between two optimizer steps publish once, not once each.
- The prompt rows are split into equal contiguous parts, one per server; every
  row is one `/v1/completions` request (token ids in, token ids and log-probs
  out), with its own seed (`request_seeds`, as the in-process engine). An
  answer must have finished ("stop", or "length" at max_new_tokens): an
  aborted request is an error, never a short completion.

Faults: every call has a timeout; the first failed call (refused, timed out,
an HTTP error, an unfinished answer) abandons the whole rollout with one
`ServerError` naming the server, the call and what was in flight, and nothing
of that rollout is used (no optimizer step happens). The run stops with its
last checkpoint intact; `grpo train --resume` reconnects, publishes the
checkpoint's weights and redraws the abandoned step's prompts from the
checkpointed sampler state.

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
from grpo.lm.engines.vllm_connect import WORKER_EXTENSION, connect_server, folder_problem
from grpo.lm.engines.vllm_cpu import (
    LoadedWeights,
    probe_ids,
    probe_problems,
    trainer_probe_logprobs,
)
from grpo.lm.engines.vllm_publish import prune_versions, publish_weights
from grpo.lm.engines.vllm_requests import check_room, request_seeds
from grpo.lm.engines.weights import trainer_weights
from grpo.lm.loading import is_peft_model
from grpo.lm.model_setup import context_length
from grpo.lm.sampling import GenerationSettings

__all__ = ["WORKER_EXTENSION", "ServerError", "VLLMServerEngine", "rank_share", "split_rows"]


def rank_share(urls: list[str]) -> tuple[list[str], str]:
    """The servers and publish sub-folder of this process: all of them and "" in one process;
    under torchrun, rank r owns urls[r::world] and publishes to "rank-r" (no two ranks reload
    one server)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return urls, ""
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(urls) < world:
        raise ValueError(
            f"rollout.server.urls: got {len(urls)} URL(s) for {world} ranks; allowed: at least "
            "one server per rank (rank r uses urls[r::world])"
        )
    return urls[rank::world], f"rank-{rank}"


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
        """Statistics of the last sync: "rollout/weight_sync_s" (publish if any, reload,
        check), "rollout/publish_s" (0 when nothing was published), "rollout/weight_loads"
        (versions published so far), "rollout/weight_checks" (checks passed),
        "rollout/probe_gap"."""
        self.checks = 0
        self.version = ""
        """The weight version every server should hold (set once all reloaded it)."""
        self.loaded = LoadedWeights()
        """The trainer's weights as last published (`loaded.loads`: how many versions)."""
        self._count = 0  # versions published, a failed one included: every label is new
        self._run = uuid.uuid4().hex[:8]  # versions of this engine never match an older run's
        self._owner = True  # closes the connections and the temporary folder (not a copy)
        self._temporary: tempfile.TemporaryDirectory | None = None
        urls, sub = rank_share(settings.urls)
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
            self.served = [
                connect_server(
                    client, tokenizer, settings.model, self.context, settings.probe_tolerance
                )
                for client in self.clients
            ]
            self.folder = self._publish_folder() / sub
            self.folder.mkdir(parents=True, exist_ok=True)
            self.sync()
        except BaseException:
            self.close()
            raise

    def _publish_folder(self) -> Path:
        """`publish_dir`, else a temporary folder inside the first server's publish root;
        checked to lie inside every server's root."""
        if self.settings.publish_dir:
            folder = Path(self.settings.publish_dir)
        else:
            root = self.served[0]["root"]
            try:
                self._temporary = tempfile.TemporaryDirectory(prefix="grpo-weights-", dir=root)
            except OSError as error:
                raise ServerError(
                    f"cannot make a publish folder in {self.clients[0].url}'s publish root "
                    f"{root} ({error}); set rollout.server.publish_dir to a folder inside "
                    "every server's root that the trainer can write"
                ) from error
            folder = Path(self._temporary.name)
        for client, served in zip(self.clients, self.served, strict=True):
            problem = folder_problem(folder, served["root"])
            if problem is not None:
                raise ServerError(f"vLLM server {client.url}: {problem}")
        return folder

    def __deepcopy__(self, memo: dict[int, Any]) -> VLLMServerEngine:
        """The engine of a policy copy (the overlapped run's sampler, `grpo.run.overlap`): the
        same servers, connections and folder, the copied model's weights, its own versions.
        Whoever samples syncs its own weights first, so the two take turns on the servers."""
        twin = copy.copy(self)
        memo[id(self)] = twin
        twin.model = copy.deepcopy(self.model, memo)
        twin.metrics, twin.checks, twin._count, twin.loaded = {}, 0, 0, LoadedWeights()
        twin._run = uuid.uuid4().hex[:8]  # its versions never share a label with this engine's
        twin._temporary = None  # the folder stays this engine's to clean up
        twin._owner = False  # and the connections this engine's to close
        return twin

    # ------------------------------------------------------------ rollouts
    def sample(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        """Sample new tokens for every row on the servers, after syncing the trainer's weights."""
        limit = min(s["max_model_len"] for s in self.served)
        check_room(prompt_rows, settings.max_new_tokens, limit, "the servers' max_model_len")
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
                    futures[pool.submit(self._complete, client, body, what, i)] = (s, i)
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
    def _complete(client: ServerClient, body: dict[str, Any], what: str, row: int):
        answer = client.post("/v1/completions", body, what)
        try:
            return parse_completion(answer, body["max_tokens"])
        except ValueError as error:
            raise ServerError(
                f"vLLM server {client.url} answered prompt row {row} with {error}, while {what}"
            ) from error

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
        """Make every server hold the trainer's current weights, then check. A new version is
        published, reloaded on every server and their prefix caches reset only when the
        weights changed since this engine last published them, or a server holds another
        version (this engine's copy reloaded it)."""
        start = time.perf_counter()
        trainer = trainer_probe_logprobs(self.model, self.probe)
        publish = self.loaded.changed(self.model, trainer) or not self._servers_hold(self.version)
        publish_s = self._publish() if publish else 0.0
        self.check(trainer)
        if publish:  # after the check: a version it failed counts as not published
            self.loaded.record(self.model, trainer)
            prune_versions(self.folder, self.settings.keep_versions)
        self.metrics = {
            "rollout/weight_sync_s": time.perf_counter() - start,
            "rollout/publish_s": publish_s,
            "rollout/weight_loads": float(self.loaded.loads),
            "rollout/weight_checks": float(self.checks),
        }
        if self.probe_gap is not None:
            self.metrics["rollout/probe_gap"] = self.probe_gap

    def _publish(self) -> float:
        """Publish the trainer's weights as a new version and reload it on every server, whose
        prefix caches are then reset; returns the seconds the publishing itself took."""
        start = time.perf_counter()
        self._count += 1
        label = f"{self._run}-{self._count:06d}"
        path = publish_weights(self.folder, label, trainer_weights(self.model))
        published = time.perf_counter() - start
        for client in self.clients:
            what = f"reloading weights version {label} from {path}"
            held = {r.get("version") for r in client.rpc("grpo_reload", [str(path), label], what)}
            if held != {label}:
                raise ServerError(f"vLLM server {client.url} answered {held} while {what}")
            answer = client.post("/reset_prefix_cache", None, "resetting its prefix cache")
            if isinstance(answer, dict) and answer.get("success") is False:
                raise ServerError(f"vLLM server {client.url} refused to reset its prefix cache")
        self.version = label
        return published

    def _held_versions(self, client: ServerClient) -> set[Any]:
        return {r.get("version") for r in client.rpc("grpo_version", [], "reporting its version")}

    def _servers_hold(self, version: str) -> bool:
        """Whether every server reports `version` (not "": the weights it started with)."""
        return bool(version) and all(self._held_versions(c) == {version} for c in self.clients)

    def check(self, trainer: torch.Tensor | None = None) -> None:
        """Raise RuntimeError unless every server holds `self.version` and computes with the
        trainer's current weights (the probe; `trainer`: its log-probs (n-1,) if known)."""
        problems = []
        for client in self.clients:
            held = self._held_versions(client)
            if held != {self.version}:
                problems.append(
                    f"{client.url} holds weights version {sorted(held)}, not {self.version!r}"
                )
        if trainer is None:
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
