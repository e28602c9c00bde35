"""Settings of `rollout.engine: vllm_server`: which `vllm serve` processes sample, and how.

The `rollout.server:` section of a run's configuration; the engine itself is
`grpo.lm.engines.vllm_server`. See docs/vllm.md, "vLLM servers".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

__all__ = ["ServerSettings"]


@dataclass
class ServerSettings:
    """Where the vLLM servers are, where the trainer publishes its weights, and time limits."""

    urls: list[str] = field(default_factory=list)
    """Base URLs of the running servers, e.g. ["http://10.0.0.2:8000"]; a rollout's prompt
    rows are split between them in equal contiguous parts. Required by engine vllm_server."""
    model: str | None = None
    """The served model name the servers must list (`--served-model-name`); None = each
    server must serve exactly one model, whichever it is."""
    api_key_env: str = "VLLM_API_KEY"
    """Name of the environment variable holding the servers' `--api-key` (sent as a bearer
    token); unset or empty = no key is sent. The key itself never goes into the config."""
    publish_dir: str | None = None
    """Folder the trainer writes each weight version to and every server reads from (a shared
    filesystem when they run on other machines), inside every server's publish root
    (GRPO_PUBLISH_ROOT); None = a temporary folder inside the first server's root, for
    servers on this machine. One run per folder."""
    keep_versions: int = 2
    """Published weight versions kept on disk (the newest); older ones are deleted once every
    server holds a newer one. At least 1."""
    timeout_s: float = 300.0
    """Longest wait for any one call to a server (a whole completion, a weight reload);
    a server that stalls longer fails the rollout with an error naming it."""
    connect_timeout_s: float = 10.0
    """Longest wait to open a connection to a server."""
    max_concurrency: int = 64
    """Requests in flight per server at once (each prompt row is one request)."""
    probe_tolerance: float | None = None
    """Largest |trainer - server| log-prob on the fixed probe sequence accepted after a weight
    reload; None = by the server's dtype (float32 1e-2, bfloat16 0.1, float16 0.05)."""

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        self.urls = [str(url).rstrip("/") for url in self.urls]
        for url in self.urls:
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(
                    f"server.urls: got {url!r}; allowed: http(s)://host:port base URLs"
                )
        if len(set(self.urls)) != len(self.urls):
            raise ValueError(f"server.urls: got {self.urls}, a URL twice; allowed: distinct URLs")
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"server.model: got {self.model!r}; allowed: None or a model name")
        if not isinstance(self.api_key_env, str) or not self.api_key_env:
            raise ValueError(
                f"server.api_key_env: got {self.api_key_env!r}; allowed: an environment "
                "variable name"
            )
        _positive_int("keep_versions", self.keep_versions)
        _positive_int("max_concurrency", self.max_concurrency)
        for name in ("timeout_s", "connect_timeout_s"):
            _positive_number(name, getattr(self, name))
        if self.probe_tolerance is not None:
            _positive_number("probe_tolerance", self.probe_tolerance)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"server.{name}: got {value!r}; allowed: an integer >= 1")


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"server.{name}: got {value!r}; allowed: a finite number > 0")
