"""The worker extension a `vllm serve` process loads for `rollout.engine: vllm_server`.

    vllm serve MODEL --worker-extension-cls grpo.lm.engines.vllm_worker.WeightReloader ...

vLLM adds these methods to its worker class; the trainer calls them through the
server's `/collective_rpc` endpoint (dev mode, `VLLM_SERVER_DEV_MODE=1`), whose
arguments arrive as strings. The server must be able to import `grpo` (the same
package as the trainer, or at least this module).

- `grpo_reload(folder, version)`: vLLM's own in-place reload
  (`reload_weights(weights_path=folder)`: checkpoint-named safetensors read from
  the folder, then the post-load processing, e.g. the CPU backend's repacking),
  then remembers `version` as what this worker holds.
- `grpo_version()`: the version of the last reload that completed ("" before any).

The version is only a label: whether the weights really are the trainer's is
checked by the trainer's probe (`vllm_server.py`), not taken on trust.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["WeightReloader"]


class WeightReloader:
    """Methods mixed into vLLM's worker (names prefixed so they cannot clash with its own)."""

    def grpo_reload(self, folder: str, version: str) -> dict[str, str]:
        """Load the weights published in `folder` and record `version`."""
        # checked first: vLLM's reload would leave its model half-reloaded, the engine dead
        if not any(Path(folder).glob("*.safetensors")):
            raise FileNotFoundError(f"no *.safetensors in {folder} (is it shared with the server?)")
        self.grpo_weights_version = ""  # a reload that fails half-way holds no known version
        self.reload_weights(weights_path=str(folder))  # type: ignore[attr-defined]
        self.grpo_weights_version = str(version)
        return {"version": self.grpo_weights_version}

    def grpo_version(self) -> dict[str, str]:
        """The version of the weights this worker holds ("" = the ones it started with)."""
        return {"version": getattr(self, "grpo_weights_version", "")}
