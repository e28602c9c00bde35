"""Settings of the rollout engines: which engine samples completions, and how vLLM runs.

`RolloutSettings` is the `rollout:` section of a run's configuration; the
engines themselves are in `grpo.lm.engines.base` (transformers) and
`grpo.lm.engines.vllm`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo.lm.engines.server_settings import ServerSettings
from grpo.precision import check_precision

__all__ = [
    "ENGINE_NAMES",
    "UNSHARABLE_LLM_ARGS",
    "VLLM_DTYPES",
    "WEIGHT_SYNCS",
    "RolloutSettings",
    "ServerSettings",
    "VLLMSettings",
]

ENGINE_NAMES = ("transformers", "lean", "vllm", "vllm_server")
WEIGHT_SYNCS = ("auto", "shared", "load_weights")
VLLM_DTYPES = ("auto", "bfloat16", "float16", "float32")

# LLM(...) arguments the engine sets itself: zero-copy sharing depends on them
FIXED_LLM_ARGS = (
    "model",
    "tokenizer",
    "dtype",
    "seed",
    "distributed_executor_backend",
    "model_impl",
    "load_format",
    "enforce_eager",
    "enable_sleep_mode",
    "gpu_memory_utilization",
    "max_model_len",
    "logprobs_mode",
    "generation_config",
    "tensor_parallel_size",
    "enable_lora",
)

_OFFLOAD = "vLLM would move weights to host memory"
UNSHARABLE_LLM_ARGS = {
    "quantization": "vLLM would compute with quantized weights, not the trainer's",
    "quantization_config": "vLLM would compute with quantized weights, not the trainer's",
    "cpu_offload_gb": _OFFLOAD,
    "cpu_offload_params": _OFFLOAD,
    "offload_backend": _OFFLOAD,
    "offload_params": _OFFLOAD,
    "offload_group_size": _OFFLOAD,
    "offload_num_in_group": _OFFLOAD,
    "offload_prefetch_step": _OFFLOAD,
    "speculative_config": "a draft model would sample with weights the trainer does not hold",
    "compilation_config": "compiled code and CUDA graphs keep the weights they were built on",
    "hf_overrides": "vLLM would build another module tree than the trainer's",
    "model_class_overrides": "vLLM would build another module tree than the trainer's",
    "pipeline_parallel_size": "the weights would be split over several processes",
    "data_parallel_size": "the weights would be split over several processes",
}
"""LLM(...) arguments that change how vLLM stores or computes with the weights, so that they
could no longer be the trainer's tensors (or a checked copy of them): refused, with why."""


@dataclass
class VLLMSettings:
    """How the vLLM engine runs beside the trainer on one GPU (see docs/vllm.md)."""

    gpu_memory_utilization: float = 0.3
    """Fraction of the GPU's memory vLLM may use for its buffers and KV cache, in (0, 1).
    The trainer's model, gradients and optimizer state must fit in the rest. Not used on
    vLLM's CPU build, whose KV cache is `engine_kwargs["kv_cache_memory_bytes"]` (1 GiB
    by default)."""
    max_model_len: int | None = None
    """Longest prompt + completion vLLM plans its KV cache for; None = the model's context."""
    dtype: str = "auto"
    """vLLM's weight dtype; "auto" = the trainer's. Another dtype rules out sharing weights."""
    weight_sync: str = "auto"
    """How vLLM gets the trainer's weights: "shared" (vLLM's parameters are the trainer's
    tensors, no copy), "load_weights" (copied before every rollout), or "auto" (shared when
    possible, else copied). On vLLM's CPU build every value reloads the weights through
    vLLM's `reload_weights` (its packed CPU weights cannot be shared)."""
    sleep_between_rollouts: bool = True
    """When vLLM's weights are a copy (LoRA, another dtype, load_weights): free its KV cache
    and discard its copy after each rollout (sleep level 2), so training can use the memory;
    both come back (wake up, then the sync's copy) before the next rollout. With shared
    weights the engine never sleeps: sleep mode would keep a dead second copy of the weights
    in vLLM's memory pool, so the KV cache stays allocated. CUDA only: off (with a log line)
    on vLLM's CPU build."""
    check_weights: bool = True
    """After every sync, check that vLLM holds the trainer's weights: the same storage when
    shared, equal fingerprints when copied, probe log-probs within `probe_tolerance` on
    vLLM's CPU build. A failed check raises. Checks match vLLM's
    parameter names with the trainer's; only unchecked copies (load_weights) skip that."""
    probe_tolerance: float | None = None
    """vLLM's CPU build only (no weights to read there): the largest |trainer - vLLM|
    log-prob on a fixed probe sequence that the check accepts; None = by dtype (float32
    1e-2, bfloat16 0.1, float16 0.05). Must be > 0."""
    tis_cap: float | None = None
    """Older spelling of rollout.tis_cap, still accepted (the two are kept equal)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further `vllm.LLM(...)` arguments (e.g. max_num_seqs); the ones the engine sets
    itself, and those that change how vLLM stores or computes with the weights
    (quantization, cpu_offload_gb, speculative_config, compilation_config, ...), are not
    allowed here."""

    def __post_init__(self) -> None:
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u < 1:
            raise ValueError(f"vllm.gpu_memory_utilization: got {u!r}; allowed: a number in (0, 1)")
        n = self.max_model_len
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"vllm.max_model_len: got {n!r}; allowed: None or an integer >= 1")
        _check_choice("dtype", self.dtype, VLLM_DTYPES)
        _check_choice("weight_sync", self.weight_sync, WEIGHT_SYNCS)
        for name in ("sleep_between_rollouts", "check_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"vllm.{name}: got {getattr(self, name)!r}; allowed: true or false"
                )
        tol = self.probe_tolerance
        if tol is not None and (
            isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < math.inf
        ):
            raise ValueError(
                f"vllm.probe_tolerance: got {tol!r}; allowed: None or a finite number > 0"
            )
        _check_cap("vllm.tis_cap", self.tis_cap)
        if not isinstance(self.engine_kwargs, Mapping):
            raise ValueError(
                f"vllm.engine_kwargs: got {type(self.engine_kwargs).__name__}; allowed: a mapping"
            )
        self.engine_kwargs = dict(self.engine_kwargs)
        fixed = sorted(set(self.engine_kwargs) & set(FIXED_LLM_ARGS))
        if fixed:
            raise ValueError(
                f"vllm.engine_kwargs: got {', '.join(fixed)}, which the engine sets itself; "
                f"allowed: any LLM argument except {', '.join(FIXED_LLM_ARGS)}"
            )
        for key in self.engine_kwargs:
            if key in UNSHARABLE_LLM_ARGS:
                raise ValueError(
                    f"vllm.engine_kwargs: got {key!r}, but {UNSHARABLE_LLM_ARGS[key]}, so it "
                    "could not sample with the trainer's weights; allowed: any LLM argument "
                    f"except {', '.join(FIXED_LLM_ARGS + tuple(UNSHARABLE_LLM_ARGS))}"
                )


@dataclass
class RolloutSettings:
    """Which engine samples the policy's completions."""

    engine: str = "transformers"
    """"transformers" (the trainer's model samples with `generate`), "lean" (the trainer's
    model samples through a lean decoding loop over its own layers: Llama, Mistral, Qwen2,
    Qwen3 and Gemma 3 text models, faster than `generate` on a CPU), "vllm" (an in-process vLLM engine
    sharing the trainer's weights; needs the `vllm` extra and a CUDA GPU, or vLLM's CPU
    build: docs/vllm.md), or "vllm_server" (running `vllm serve` processes, given in
    `server`, sampling with weights the trainer publishes to a folder: docs/vllm.md)."""
    vllm: VLLMSettings = field(default_factory=VLLMSettings)
    """Settings of the vLLM engine (used when engine is "vllm")."""
    server: ServerSettings = field(default_factory=ServerSettings)
    """Settings of the vLLM servers (used when engine is "vllm_server")."""
    precision: str | None = None
    """What the transformers and lean engines compute in while sampling (fp32, bf16-mixed,
    fp16-mixed, bf16-copy, or auto as in policy.precision: `grpo.precision`); None =
    policy.precision. The transformers engine runs generate under autocast, or under
    bf16-copy on the policy's bfloat16 copy (the scorer's, when policy.precision is
    bf16-copy too); the lean engine, over float32 weights, samples from a copy of the
    weights cast to the low dtype once per rollout, attention and cache in float32
    (docs/performance.md). When it differs from
    policy.precision, sampling is no longer the scorer's distribution: the old-log-prob pass
    runs, the rollout metrics report the gap (rollout/logprob_gap_*), and `tis_cap` weighs
    the loss. vLLM has its own vllm.dtype."""
    tis_cap: float | None = None
    """Cap C of truncated importance sampling, w = min(π_old / π_sampler, C) per token on the
    policy loss (Yao et al. 2025), for any engine whose sampler is not the scorer (vLLM, or
    the transformers and lean engines sampling in another precision); None = no correction.
    Also caps the behaviour correction of groups sampled with older weights
    (`run.max_staleness`; None there = untruncated), top-k / top-p sampling's included, whose
    correction is capped at 1 only while the sampler's weights are π_old's. Must be >= 1."""

    def __post_init__(self) -> None:
        _check_choice("engine", self.engine, ENGINE_NAMES, owner="rollout")
        if self.precision is not None:
            self.precision = check_precision("rollout.precision", self.precision, auto=True)
        _check_cap("rollout.tis_cap", self.tis_cap)
        if not isinstance(self.vllm, VLLMSettings):
            raise TypeError(
                f"rollout.vllm: got {type(self.vllm).__name__}; allowed: VLLMSettings "
                "(use RolloutSettings.from_dict for a mapping)"
            )
        if not isinstance(self.server, ServerSettings):
            raise TypeError(
                f"rollout.server: got {type(self.server).__name__}; allowed: ServerSettings "
                "(use RolloutSettings.from_dict for a mapping)"
            )
        if self.engine == "vllm_server" and not self.server.urls:
            raise ValueError(
                "rollout.server.urls: got no URL with rollout.engine='vllm_server'; allowed: "
                "one or more base URLs of running `vllm serve` processes"
            )
        self._one_tis_cap()

    def _one_tis_cap(self) -> None:
        """rollout.tis_cap and its older spelling vllm.tis_cap: one value, held by both."""
        cap, old = self.tis_cap, self.vllm.tis_cap
        if cap is not None and old is not None and cap != old:
            raise ValueError(
                f"rollout.tis_cap={cap} and vllm.tis_cap={old}: one cap, two spellings; "
                "allowed: set rollout.tis_cap only"
            )
        self.tis_cap = self.vllm.tis_cap = cap if cap is not None else old

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RolloutSettings:
        """Build from a mapping (e.g. a YAML `rollout:` section); unknown keys are an error."""
        values = dict(values)
        _check_keys("rollout", values, cls)
        vllm = values.pop("vllm", {})
        if isinstance(vllm, Mapping):
            _check_keys("rollout.vllm", vllm, VLLMSettings)
            vllm = VLLMSettings(**vllm)
        server = values.pop("server", {})
        if isinstance(server, Mapping):
            _check_keys("rollout.server", server, ServerSettings)
            server = ServerSettings(**server)
        return cls(vllm=vllm, server=server, **values)


def _check_cap(name: str, cap: Any) -> None:
    if cap is not None and (
        isinstance(cap, bool)
        or not isinstance(cap, (int, float))
        or not math.isfinite(cap)
        or cap < 1
    ):
        raise ValueError(f"{name}: got {cap!r}; allowed: None or a finite number >= 1")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...], owner: str = "vllm") -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name}: got {value!r}; allowed: {', '.join(allowed)}")


def _check_keys(owner: str, values: Mapping[str, Any], kind: type) -> None:
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"{owner}: got unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(known))}"
        )
