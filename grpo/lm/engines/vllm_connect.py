"""The checks the `vllm_server` engine makes on each server before its first rollout.

Each server must serve the expected model (`/v1/models`), with a maximum
length no longer than the trainer's context, the same tokenizer (a fixed text
tokenised by `/tokenize` gives the trainer's ids), processed log-probs and no
checkpoint sampling defaults (`/server_info`), the worker extension
`grpo.lm.engines.vllm_worker.WeightReloader`, and a publish root
(`GRPO_PUBLISH_ROOT`, `/collective_rpc` `grpo_root`) that holds the trainer's
publish folder: the extension reloads nothing outside it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from grpo.lm.engines.vllm_client import ServerClient, ServerError
from grpo.lm.engines.vllm_cpu import probe_tolerance
from grpo.lm.engines.vllm_worker import ROOT_ENV

__all__ = ["TOKENIZER_CHECK_TEXT", "WORKER_EXTENSION", "connect_server", "folder_problem"]

WORKER_EXTENSION = "grpo.lm.engines.vllm_worker.WeightReloader"
"""The `--worker-extension-cls` every server must run with."""
TOKENIZER_CHECK_TEXT = " 12+34=46\nThe answer is: yes, no. (x) [y] {z} é"
"""Tokenised by the server and the trainer at connect (with the special tokens prepended)."""


def connect_server(
    client: ServerClient,
    tokenizer: Any,
    want: str | None,
    context: int | None,
    tolerance: float | None,
) -> dict[str, Any]:
    """Check one server against the trainer (`want`: the model name it must serve, None = its
    only one); returns its model name, maximum length, probe tolerance and publish root."""
    models = client.get("/v1/models", "listing its models")["data"]
    names = [m["id"] for m in models]
    if (want is None and len(names) != 1) or (want is not None and want not in names):
        raise ServerError(
            f"vLLM server {client.url} serves {names}; expected "
            + (f"{want!r} (rollout.server.model)" if want else "exactly one model")
        )
    served = next(m for m in models if want is None or m["id"] == want)
    max_len = int(served["max_model_len"])
    if context is not None and max_len > context:
        raise ServerError(
            f"vLLM server {client.url}: max_model_len {max_len} is longer than the "
            f"trainer's context ({context}), which could not score such completions; "
            f"start it with --max-model-len {context}"
        )
    config = _server_config(client)
    _check_tokenizer(client, tokenizer, served["id"])
    dtype = getattr(torch, str(config["model_config"].get("dtype", "")).removeprefix("torch."))
    return {
        "model": served["id"],
        "max_model_len": max_len,
        "tolerance": probe_tolerance(dtype, tolerance),
        "root": _publish_root(client),
    }


def _server_config(client: ServerClient) -> dict[str, Any]:
    """The server's vLLM config (`/server_info`, dev mode), checked for what the engine needs."""
    try:
        info = client.get("/server_info", "reading its config", {"config_format": "json"})
    except ServerError as error:
        raise ServerError(
            f"{error}. The engine needs the server's dev endpoints: start it with "
            "VLLM_SERVER_DEV_MODE=1 (docs/vllm.md, vLLM servers)"
        ) from error
    config = info["vllm_config"]
    model, parallel = config["model_config"], config["parallel_config"]
    wanted = {
        "--logprobs-mode processed_logprobs": model.get("logprobs_mode") == "processed_logprobs",
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


def _check_tokenizer(client: ServerClient, tokenizer: Any, model: str) -> None:
    text = "".join(tokenizer.all_special_tokens) + TOKENIZER_CHECK_TEXT
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    theirs = client.post("/tokenize", body, "tokenising the tokenizer check")["tokens"]
    ours = tokenizer(text, add_special_tokens=False)["input_ids"]
    if list(theirs) != list(ours):
        raise ServerError(
            f"vLLM server {client.url} tokenises {text!r} as {theirs}, the trainer as "
            f"{ours}: it serves another tokenizer; start it on the trainer's model folder"
        )


def _publish_root(client: ServerClient) -> str:
    """The folder the server's worker extension reloads from (its `GRPO_PUBLISH_ROOT`)."""
    roots = {r.get("root") for r in client.rpc("grpo_root", [], "reporting its publish root")}
    if len(roots) != 1 or not next(iter(roots)):
        raise ServerError(
            f"vLLM server {client.url} has no single publish root (its workers report "
            f"{sorted(map(str, roots))}): start it with {ROOT_ENV} set to the folder the "
            "trainer publishes into (docs/vllm.md, vLLM servers)"
        )
    return str(roots.pop())


def folder_problem(folder: Path, root: str) -> str | None:
    """Why a server whose publish root is `root` would refuse versions published in `folder`
    (None when it would load them). Compared as paths, not resolved: the server resolves
    links on its side."""
    path = Path(os.path.abspath(folder))
    if path.is_relative_to(root):
        return None
    return (
        f"the trainer publishes into {path}, outside the server's publish root {root} "
        f"({ROOT_ENV}); set rollout.server.publish_dir to a folder inside it, or start the "
        "server with a root that holds the publish folder"
    )
