"""A stand-in for `vllm serve` running grpo's worker extension, behind `ServerClient`'s methods.

`FakeServer` holds its own copy of a model and answers the calls the `vllm_server` engine
makes: the connect checks, `/collective_rpc` into the real `WeightReloader` (whose
`reload_weights` loads the published safetensors into the copy), prefix-cache resets, probe
scoring and completions sampled from the copy. `serve(monkeypatch, servers)` makes the
engine's `ServerClient(url, ...)` reach `servers[url]`. Every call is counted by path.
"""

from __future__ import annotations

import copy
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from grpo.lm.engines import vllm_server, vllm_worker
from grpo.lm.engines.vllm_client import ServerError
from grpo.lm.engines.vllm_connect import WORKER_EXTENSION


class _Worker(vllm_worker.WeightReloader):
    """The extension mixed into a worker whose `reload_weights` loads into `model`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def reload_weights(self, weights_path: str) -> None:
        tensors = load_file(str(Path(weights_path) / "model.safetensors"))
        self.model.load_state_dict(tensors, strict=False)


class FakeServer:
    """One server: a copy of `model`, the tokenizer, and the worker with its publish root
    (`vllm_worker.PUBLISH_ROOT`, patched by `serve`)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, root: Path | None) -> None:
        self.model = copy.deepcopy(model).eval()
        self.tokenizer, self.root = tokenizer, root
        self.url = "http://fake"  # set by `serve`
        self.worker = _Worker(self.model)
        self.calls: Counter[str] = Counter()  # path (or rpc method) -> calls
        self.reloads: list[tuple[str, str]] = []
        """(version label, SHA-256 of its model.safetensors) of every reload that took."""
        self.finish: dict[tuple[int, ...], tuple[str, int]] = {}
        """Prompt tokens -> (finish_reason, tokens kept): answers to tamper with. Keyed by the
        prompt, not by arrival: a call left running by an abandoned rollout may arrive late."""

    def get(self, path: str, what: str, params: dict[str, str] | None = None) -> Any:
        self.calls[path] += 1
        if path == "/v1/models":
            length = self.model.config.max_position_embeddings
            return {"data": [{"id": "fake", "max_model_len": length}]}
        if path == "/server_info":
            model_config = {"dtype": "torch.float32", "logprobs_mode": "processed_logprobs",
                            "generation_config": "vllm"}  # fmt: skip
            parallel = {"worker_extension_cls": WORKER_EXTENSION}
            return {"vllm_config": {"model_config": model_config, "parallel_config": parallel}}
        raise AssertionError(f"GET {path}")

    def post(self, path: str, body: dict[str, Any] | None, what: str) -> Any:
        self.calls[path] += 1
        if path == "/tokenize":
            tokens = self.tokenizer(body["prompt"], add_special_tokens=False)["input_ids"]
            return {"tokens": tokens}
        if path == "/reset_prefix_cache":
            return None
        if path == "/v1/completions":
            return self._completion(body)
        raise AssertionError(f"POST {path}")

    def rpc(self, method: str, args: list[str], what: str) -> list[Any]:
        self.calls[method] += 1
        vllm_worker.PUBLISH_ROOT = self.root  # each server's root, fixed at its start
        try:
            result = [getattr(self.worker, method)(*args)]
        except Exception as error:  # what vLLM answers: HTTP 500 with the error's text
            message = f"vLLM server {self.url} answered HTTP 500 while {what}: {error}"
            raise ServerError(message) from error
        if method == "grpo_reload":
            data = (Path(args[0]) / "model.safetensors").read_bytes()
            self.reloads.append((args[1], hashlib.sha256(data).hexdigest()))
        return result

    @torch.no_grad()
    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = list(body["prompt"])
        if body["prompt_logprobs"] is not None:  # the probe: log p of every prompt token
            logp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0], -1)
            entries = [None] + [
                {str(t): {"logprob": float(logp[i, t])}} for i, t in enumerate(ids[1:])
            ]
            return {"choices": [{"prompt_logprobs": entries, "finish_reason": "length"}]}
        generator = torch.Generator().manual_seed(body["seed"] or 0)
        new, logprobs, reason = [], [], "length"
        for _ in range(body["max_tokens"]):
            logits = self.model(input_ids=torch.tensor([ids + new])).logits[0, -1]
            if body["temperature"] == 0:
                token = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                logp = torch.log_softmax(logits / body["temperature"], -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            new.append(token)
            logprobs.append(float(logp[token]))
            if token in body["stop_token_ids"]:
                reason = "stop"
                break
        if tuple(body["prompt"]) in self.finish:
            reason, kept = self.finish[tuple(body["prompt"])]
            new, logprobs = new[:kept], logprobs[:kept]
        choice = {"token_ids": new, "logprobs": {"token_logprobs": logprobs}}
        return {"choices": [{**choice, "finish_reason": reason}]}


def serve(monkeypatch: Any, servers: dict[str, FakeServer]) -> None:
    """Make the engine's clients for each URL in `servers` talk to that stand-in."""

    for url, server in servers.items():
        server.url = url

    class Client:
        def __init__(self, url: str, *args: Any) -> None:
            self.url, self.timeout_s = url, 30.0
            self.server = servers[url]
            self.get, self.post, self.rpc = self.server.get, self.server.post, self.server.rpc

        def close(self) -> None:
            pass

    monkeypatch.setattr(vllm_server, "ServerClient", Client)
    monkeypatch.setattr(vllm_worker, "PUBLISH_ROOT", None)
