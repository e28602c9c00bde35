"""In-process vLLM rollouts that compute with the trainer's own weight tensors (picoRL).

vLLM runs inside this process: single-process executor ("uni") with the
engine core in-process, the transformers model implementation (its module
names are the Hugging Face ones), dummy weight loading (nothing is read from
disk) and eager mode (CUDA graphs would keep pointing at the dummy weights).
Then every vLLM parameter is rebound to the trainer's tensor, `p.data =
hf_p.data` (`grpo.lm.engines.weights.share_parameters`), so an optimizer step on
the trainer's model is what vLLM samples with, with no copy. Where sharing
cannot apply (a LoRA model: vLLM must hold W + BA; another dtype; another
device), the weights are copied with vLLM's `load_weights` before every rollout.
The trainer's classes, RNGs and threads are left as they were
(`vllm_build.py`); `close()` (or a `with` block) frees the engine.

Each rollout: wake up (copies only), sync (a copy, unless shared), reset the
prefix cache (its KV was computed with the old weights; a refused reset
raises), check that vLLM holds the trainer's weights, generate, sleep. vLLM is
imported only when an engine is built (vLLM >= 0.11: V1 engine, `apply_model`,
`logprobs_mode`). Its CPU build (`vllm_cpu.py`): no sleep, no sharing; weights
reloaded with `reload_weights` before a rollout when they changed since the last
reload, and checked by a probe before every rollout.

Departures and choices:
- Sleep mode only when vLLM's weights are a copy. A sleep-mode engine puts
  its weights in vLLM's own CUDA memory pool (`gpu_worker.load_model`), which
  `torch.cuda.empty_cache()` cannot return, and sleep level 1 backs that pool
  up to host memory and back: with shared weights, a dead second copy awake
  and asleep. A shared engine is therefore built without sleep mode (its dummy
  weights come from torch's allocator and are returned once shared; its KV
  cache stays allocated: size it with `gpu_memory_utilization`). A copying
  engine sleeps at level 2: its copy is discarded, not backed up (the next
  sync rewrites it; vLLM keeps the buffers), so asleep one copy exists.
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
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from grpo.lm.engines.base import Samples
from grpo.lm.engines.settings import VLLMSettings
from grpo.lm.engines.vllm_build import (
    build_llm,
    release_memory,
    require_vllm,
    reset_prefix_cache,
    shutdown_llm,
    write_model_folder,
)
from grpo.lm.engines.vllm_cpu import (
    LoadedWeights,
    cpu_llm_args,
    engine_probe_logprobs,
    probe_ids,
    probe_problems,
    probe_tolerance,
    reload_weights,
    trainer_probe_logprobs,
    vllm_on_cpu,
)
from grpo.lm.engines.vllm_requests import (
    check_room,
    parse_outputs,
    request_seeds,
    sampling_params_kwargs,
)
from grpo.lm.engines.vllm_sharing import choose_sharing, expects_sharing, match_names
from grpo.lm.engines.weights import (
    copy_problems,
    expected_rows,
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
    "expects_sharing",
    "parse_outputs",
    "request_seeds",
    "require_vllm",
    "sampling_params_kwargs",
]

log = logging.getLogger(__name__)

SLEEP_LEVEL = 2  # a copy is discarded while asleep (the next sync rewrites it), not backed up


class VLLMEngine:
    """vLLM sampling for `CausalLMPolicy`, holding the trainer's weights (shared or copied).

    Holds vLLM's engine, memory and a temporary folder until `close()`; use it as a context
    manager, or close it where the run ends (`grpo.run.train` does, errors included).
    """

    samples_with_scorer = False  # other kernels: its log-probs differ, so π_old is recorded

    def __init__(self, model: nn.Module, tokenizer: Any, settings: VLLMSettings) -> None:
        require_vllm()
        self.model = model
        self.settings = settings
        self.tis_cap = settings.tis_cap
        self.metrics: dict[str, float] = {}
        """Statistics of the last sync: "rollout/weight_sync_s" (copy, prefix reset, check),
        "rollout/weight_loads" (syncs so far that gave vLLM the weights; CPU: only when they
        changed), "rollout/weight_checks" (checks passed so far), "rollout/probe_gap" (CPU)."""
        self.checks = 0
        """How many weight checks have passed (one per sync when `check_weights`)."""
        self.on_cpu = vllm_on_cpu()
        """vLLM's CPU build: no sleep, no sharing; weights reloaded if changed, always probed."""
        self.loaded = LoadedWeights()
        """The trainer's weights as vLLM last got them (`loaded.loads`: how many times)."""
        trainer_dtype = next(model.parameters()).dtype
        self.dtype = trainer_dtype if settings.dtype == "auto" else getattr(torch, settings.dtype)
        self.config = (model.get_base_model() if is_peft_model(model) else model).config
        """The trainer's model configuration (its base model's, under LoRA)."""
        self.context: int | None = settings.max_model_len or getattr(
            self.config, "max_position_embeddings", None
        )
        """The longest prompt + completion vLLM plans for (its max_model_len)."""
        self.sleeps = (
            settings.sleep_between_rollouts
            and not self.on_cpu
            and not expects_sharing(settings, model, self.dtype)
        )
        """Sleep mode: only for a copy of the weights (see the module docstring)."""
        self._folder = tempfile.TemporaryDirectory(prefix="grpo-vllm-")
        self.llm: Any = None
        try:
            write_model_folder(model, tokenizer, self._folder.name)
            args = self._llm_args()  # CPU build: its thread binding needs vLLM's threads
            self.llm = build_llm(model, self._folder.name, args, keep_threads=not self.on_cpu)
            self._awake = True
            self.weights = trainer_weights(model)
            if self.on_cpu:
                self._init_cpu()
            else:
                self._init_gpu(model, settings)
            self.sync()
            self._sleep()  # training may need the memory before the first rollout
        except BaseException:
            self.close()
            raise

    def _llm_args(self) -> dict[str, Any]:
        settings = self.settings
        args: dict[str, Any] = {
            "dtype": str(self.dtype).removeprefix("torch."),
            "seed": 0,
            "distributed_executor_backend": "uni",
            "tensor_parallel_size": 1,
            "load_format": "dummy",
            "enforce_eager": True,
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "max_model_len": settings.max_model_len,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # no checkpoint sampling defaults: the requests decide
            "model_impl": "transformers",
            "enable_sleep_mode": self.sleeps,
            **settings.engine_kwargs,
        }
        if self.on_cpu:
            sync, sleep = settings.weight_sync, settings.sleep_between_rollouts
            args.update(cpu_llm_args(settings.engine_kwargs, sleep, sync))
        elif settings.sleep_between_rollouts and not self.sleeps:
            log.info("vLLM is to share the trainer's weights: no sleep mode, the KV cache stays")
        return args

    def _init_cpu(self) -> None:
        self.mapping: dict[str, tuple[str, ...]] = {}
        self.shared = False
        self.sharing_problems = ["vLLM's CPU backend packs its weights (no tensor to share)"]
        self.probe = probe_ids(self.config.vocab_size, self.context)
        self.probe_gap: float | None = None
        """Largest |trainer - vLLM| log-prob on the probe at the last check."""
        self.probe_previous: torch.Tensor | None = None
        """The trainer's probe log-probs at the last check that passed (the direction check)."""
        self.tolerance = probe_tolerance(self.dtype, self.settings.probe_tolerance)

    def _init_gpu(self, model: nn.Module, settings: VLLMSettings) -> None:
        engine_params = self._call(lambda m: dict(m.named_parameters(remove_duplicate=False)))
        self.mapping = match_names(engine_params, self.weights, settings)
        lora = is_peft_model(model)
        problems = [] if lora else sharing_problems(engine_params, self.weights, self.mapping)
        self.shared = choose_sharing(settings.weight_sync, lora, problems)
        self.sharing_problems = problems
        """Why weights are copied rather than shared (empty when shared, or for LoRA)."""
        if self.shared:
            share_parameters(engine_params, self.weights, self.mapping)
            del engine_params
            # no sleep mode: vLLM's dummy weights came from torch's allocator, returned here
            torch.cuda.empty_cache()
        elif settings.sleep_between_rollouts and not self.sleeps:  # built to share, then could not
            log.warning(
                "vLLM could not share the trainer's weights (%s): it copies them before every "
                "rollout and, built without sleep mode, keeps its copy and KV cache between "
                "rollouts; rollout.vllm.weight_sync: load_weights builds it to sleep",
                "; ".join(problems) or "LoRA",
            )

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

        whose = "rollout.vllm.max_model_len" if self.settings.max_model_len else "the model's context"
        check_room(prompt_rows, settings.max_new_tokens, self.context, whose)
        params = [
            SamplingParams(**sampling_params_kwargs(settings, eos_ids, s))
            for s in request_seeds(seed, len(prompt_rows))
        ]
        prompts = [{"prompt_token_ids": [int(t) for t in row]} for row in prompt_rows]
        with self._woken():
            self.sync()  # the trainer may have stepped since the last rollout
            outputs = self._open().generate(prompts, params, use_tqdm=False)
        return parse_outputs(outputs)

    def sync(self) -> None:
        """Give vLLM the trainer's current weights (a copy unless shared), then check. On the
        CPU build the reload and the prefix-cache reset are skipped when the weights did not
        change since the last reload (`LoadedWeights`); the probe checks all the same."""
        with self._woken():  # a copy must not land in memory vLLM has released
            start = time.perf_counter()
            trainer = trainer_probe_logprobs(self.model, self.probe) if self.on_cpu else None
            load = trainer is None or self.loaded.changed(self.model, trainer)
            weights = None
            if load:
                weights = self.weights if self.shared else self._load()
                reset_prefix_cache(self._open())  # cached KV was computed with the old weights
            if self.settings.check_weights:
                self.check(weights, trainer)
            if load:  # after the check: a load it failed counts as not made
                self.loaded.record(self.model, trainer)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.metrics = {
                "rollout/weight_sync_s": time.perf_counter() - start,
                "rollout/weight_loads": float(self.loaded.loads),
                "rollout/weight_checks": float(self.checks),
            }
            if self.on_cpu and self.probe_gap is not None:
                self.metrics["rollout/probe_gap"] = self.probe_gap

    def _load(self) -> dict[str, torch.Tensor]:
        """Copy the trainer's current weights into vLLM (never shared here); returns them."""
        weights = trainer_weights(self.model)  # LoRA: W + BA of the current adapters
        if self.on_cpu:
            reload_weights(self._open(), weights)  # copies, then repacks for the CPU kernels
        else:
            items = [(name, t.detach()) for name, t in weights.items()]  # no autograd in vLLM
            self._call(lambda m: m.load_weights(items))
        return weights

    def check(
        self, weights: dict[str, torch.Tensor] | None = None, trainer: torch.Tensor | None = None
    ) -> None:
        """Raise RuntimeError unless vLLM computes with the trainer's weights right now
        (`weights`: the trainer's, if known; `trainer`: its probe log-probs (n-1,), CPU)."""
        if self.on_cpu:
            problems = self._probe_problems(trainer)
        elif self.shared:
            layout = self._call(parameter_layout)
            problems = storage_problems(layout, self.weights, self.mapping)
        else:
            weights = trainer_weights(self.model) if weights is None else weights
            rows = expected_rows(weights, self.mapping)
            with self._woken() as woke:
                if woke:  # asleep, vLLM's copy was discarded: what it holds awake is a sync
                    self._load()
                engine = self._call(lambda m: parameter_fingerprints(m, rows))
            problems = copy_problems(engine, weights, self.mapping, self.dtype)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise RuntimeError(
                "vLLM does not hold the trainer's weights: " + "; ".join(problems[:5]) + more
            )
        self.checks += 1

    def _probe_problems(self, trainer: torch.Tensor | None = None) -> list[str]:
        """The probe scored by vLLM and by the trainer (`trainer`, if known): [] when they agree
        within tolerance and vLLM is nearer the trainer's current weights than the last check's."""
        if trainer is None:
            trainer = trainer_probe_logprobs(self.model, self.probe)
        engine = engine_probe_logprobs(self._open(), self.probe)
        self.probe_gap = float((trainer - engine).abs().max())
        problems = probe_problems(engine, trainer, self.probe_previous, self.tolerance)
        if not problems:
            self.probe_previous = trainer  # the weights vLLM was shown to hold
        return problems

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Shut vLLM down and free what it holds (engine, KV cache, its weights or buffers,
        the temporary folder); the trainer's model is untouched. Safe to call twice."""
        llm, self.llm = self.llm, None
        try:
            if llm is not None:
                if not getattr(self, "_awake", True):
                    llm.wake_up()  # vLLM frees its pool's memory mapped, not asleep
                    self._awake = True
                shutdown_llm(llm)
        finally:
            del llm
            release_memory()
            self._folder.cleanup()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ helpers
    def _open(self) -> Any:
        """vLLM's `LLM`; raises once the engine is closed."""
        if self.llm is None:
            raise RuntimeError("this vLLM engine is closed (VLLMEngine.close); build a new one")
        return self.llm

    def _call(self, fn: Callable[[nn.Module], Any]) -> Any:
        """fn(vLLM's model), run where the model lives (this process)."""
        llm = self._open()
        if hasattr(llm, "apply_model"):
            return llm.apply_model(fn)[0]  # one result per worker; there is one worker
        return fn(llm.llm_engine.model_executor.driver_worker.worker.model_runner.model)

    @contextlib.contextmanager
    def _woken(self) -> Iterator[bool]:
        """Awake inside (yields whether it had to wake); asleep again afterwards if it was."""
        was_asleep = not self._awake
        self._wake()
        try:
            yield was_asleep
        finally:
            if was_asleep:
                self._sleep()

    def _wake(self) -> None:
        if not self._awake:
            self._open().wake_up()
            self._awake = True

    def _sleep(self) -> None:
        if self.sleeps and self._awake:
            self._open().sleep(level=SLEEP_LEVEL)
            self._awake = False
