"""The worker extension a `vllm serve` process loads for `rollout.engine: vllm_server`.

    GRPO_PUBLISH_ROOT=/shared/grpo-weights vllm serve MODEL \\
        --worker-extension-cls grpo.lm.engines.vllm_worker.WeightReloader ...

vLLM adds these methods to its worker class; the trainer calls them through the
server's `/collective_rpc` endpoint (dev mode, `VLLM_SERVER_DEV_MODE=1`), whose
arguments arrive as strings. The server must be able to import `grpo` (the same
package as the trainer, or at least this module).

- `grpo_reload(folder, version)`: vLLM's own in-place reload
  (`reload_weights(weights_path=folder)`: checkpoint-named safetensors read from
  the folder, then the post-load processing, e.g. the CPU backend's repacking),
  then remembers `version` as what this worker holds. Only folders inside the
  publish root are loaded (`reload_problem`).
- `grpo_version()`: the version of the last reload that completed ("" before any).
- `grpo_root()`: the publish root ("" when the server was started without one).

The publish root is fixed when the server starts: the environment variable
`GRPO_PUBLISH_ROOT`, read once when vLLM imports this module into its worker.
No caller can change it. Unset, every reload is refused. vLLM's API key does
not guard `/collective_rpc` (docs/vllm.md, "Security"): the root only keeps
this extension from loading other folders; vLLM's own worker methods stay
callable there by whoever reaches the port.

The version is only a label: whether the weights really are the trainer's is
checked by the trainer's probe (`vllm_server.py`), not taken on trust.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ROOT_ENV", "WeightReloader", "publish_root", "reload_problem"]

ROOT_ENV = "GRPO_PUBLISH_ROOT"
"""The environment variable naming the only folder (with its sub-folders) a server reloads from."""


def publish_root(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The publish root `environ` names, made absolute (None when unset or empty)."""
    value = environ.get(ROOT_ENV, "")
    return Path(os.path.abspath(value)) if value else None


PUBLISH_ROOT = publish_root()
"""This process's publish root, as it was when the module was imported (the server's start)."""


def reload_problem(folder: str, root: Path | None) -> str | None:
    """Why the worker must not load `folder` (None when it may): it must be an absolute path
    that lies inside `root` once symbolic links and ".." are resolved, and hold safetensors."""
    if root is None:
        return (
            f"this server was started without {ROOT_ENV}, so it reloads no folder; restart it "
            f"with {ROOT_ENV} set to the folder the trainer publishes into (docs/vllm.md)"
        )
    if not os.path.isabs(folder):
        return f"{folder!r} is not an absolute path"
    real, real_root = Path(folder).resolve(), root.resolve()
    if not real.is_relative_to(real_root):
        return (
            f"{folder} is outside this server's publish root {root} ({ROOT_ENV}); only "
            "folders inside it are loaded"
        )
    if not any(real.glob("*.safetensors")):
        return f"no *.safetensors in {folder} (is it shared with the server?)"
    return None


class WeightReloader:
    """Methods mixed into vLLM's worker (names prefixed so they cannot clash with its own)."""

    def grpo_reload(self, folder: str, version: str) -> dict[str, str]:
        """Load the weights published in `folder` and record `version`; refuses (ValueError)
        a folder outside the publish root."""
        # checked first: vLLM's reload would leave its model half-reloaded, the engine dead
        problem = reload_problem(str(folder), PUBLISH_ROOT)
        if problem is not None:
            raise ValueError(f"grpo_reload refused: {problem}")
        self.grpo_weights_version = ""  # a reload that fails half-way holds no known version
        real = str(Path(folder).resolve())  # the folder checked, whatever links change later
        self.reload_weights(weights_path=real)  # type: ignore[attr-defined]
        self.grpo_weights_version = str(version)
        return {"version": self.grpo_weights_version}

    def grpo_version(self) -> dict[str, str]:
        """The version of the weights this worker holds ("" = the ones it started with)."""
        return {"version": getattr(self, "grpo_weights_version", "")}

    def grpo_root(self) -> dict[str, str]:
        """The publish root this worker reloads from ("" = none: every reload is refused)."""
        return {"root": "" if PUBLISH_ROOT is None else str(PUBLISH_ROOT)}
