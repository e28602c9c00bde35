"""Every CUDA number of the project, from one command: the GPU check.

    python bench/gpu_check.py [--out gpu_check.json] [--budget-s 540] [--parts a,b]

Writes one JSON file (every part: "ok", "skipped" with the reason, or "failed"
with the error) and prints a table. Parts:

- with CUDA and vLLM (`gpu_check_vllm.py`): the trainer's forward after the
  engine build; zero-copy sharing and its storage check, with the memory the
  engine holds; one sleep/wake of a copying engine, with what vLLM logs as
  freed and backed up; an optimizer step visible to vLLM without a copy; the
  bfloat16 log-prob gap; LoRA through the merged copy; close and build again;
- with CUDA: one GRPO step (sampling with `generate`, scoring, backward,
  AdamW) of the demo's shapes (grpo/assets/arith-tiny, B=32, G=8, T=5) and of
  SmolLM2-135M's shape (random weights, B=8, G=8, T=64), in float32, bfloat16,
  bf16 mixed precision, FSDP2 on one GPU, and LoRA adapters: seconds per step,
  completion tokens per second, peak memory;
- with CUDA (`gpu_check_train.py`): `grpo train configs/demo.yaml` on the GPU,
  with and without overlapped rollouts, and the CPU's and the GPU's float32
  log-probs and gradients of the same completions side by side;
- without CUDA: every part is reported skipped.

`--record NAME` also writes the result as a record (`bench/records.py`) into
`--results` (default bench/results/), which `bench/render_results.py` renders
into docs/gpu.md.

Each part runs only while the time budget lasts (the rest: skipped, with why),
so the whole check stays under 10 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

DEMO_MODEL = REPO / "grpo" / "assets" / "arith-tiny"
SMOLLM2_135M = {  # LlamaConfig of SmolLM2-135M (random weights here)
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
}
SHAPES = {  # name -> (B prompts, G group size, T new tokens)
    "demo": (32, 8, 5),
    "smollm2-135m": (8, 8, 64),
}
TIMED_STEPS = 3  # after one warm-up step


def demo_model(dtype: torch.dtype):
    from grpo.lm.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(DEMO_MODEL))
    return model.to("cuda", dtype), tokenizer


def smollm2_shape(dtype: torch.dtype):
    """A random-init model of SmolLM2-135M's shape, with the tests' tokenizer."""
    from tiny_models import build_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        **SMOLLM2_135M, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to("cuda", dtype), tokenizer


MODELS: dict[str, Callable] = {"demo": demo_model, "smollm2-135m": smollm2_shape}


def prompts(shape: str, n: int) -> list[dict]:
    if shape == "demo":
        return [{"prompt": f"{10 + i}+{23 + 2 * i}="} for i in range(n)]
    from tiny_models import WORDS

    return [{"prompt": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(12))} for i in range(n)]


def policy_settings(max_new_tokens: int, precision: str | None):
    """CausalLMSettings for a step; raises LookupError when `precision` does not exist here."""
    from grpo.lm.policy import CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    values = {"generation": GenerationSettings(max_new_tokens=max_new_tokens, seed=0)}
    values["micro_batch_size"] = 64
    if precision is not None:
        if "precision" not in {f.name for f in dataclasses.fields(CausalLMSettings)}:
            raise LookupError("policy.precision does not exist in this version")
        values["precision"] = precision
    return CausalLMSettings(**values)


def step_part(shape: str, dtype: torch.dtype, precision: str | None = None, fsdp2=False,
              lora=False):  # fmt: skip
    """One part: warm-up step, then TIMED_STEPS timed GRPO steps."""

    def run() -> dict:
        from grpo.config import GRPOConfig
        from grpo.lm.policy import CausalLMPolicy
        from grpo.rewards.combine import TextReward
        from grpo.step.trainer import GRPOTrainer

        b, g, t = SHAPES[shape]
        try:
            settings = policy_settings(t, precision)
        except (LookupError, TypeError, ValueError) as error:
            return {"status": "skipped", "reason": f"{precision} not available: {error}"}
        model, tokenizer = MODELS[shape](dtype)
        if lora:
            from grpo.lm.loading import LoraSettings, apply_lora

            model = apply_lora(model, LoraSettings(r=16, alpha=32))
        policy = CausalLMPolicy(model, tokenizer, settings)
        reward = TextReward(lambda prompts, completions, **_: [len(c) / 10 for c in completions])
        config = GRPOConfig(group_size=g, batch_size=b * g, kl_coeff=0.0, learning_rate=1e-5)
        states = prompts(shape, b)
        with one_gpu_fsdp2(fsdp2) as distributed_config:
            trainer = GRPOTrainer(policy, reward, None, config, distributed_config)
            trainer.train_step(states)  # warm-up: kernels, allocator
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start, tokens = time.perf_counter(), 0.0
            for _ in range(TIMED_STEPS):
                trainer.train_step(states)
                tokens += policy.rollout_metrics["completion/length_mean"] * b * g
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / TIMED_STEPS
        return {
            "status": "ok",
            "s_per_step": seconds,
            "tokens_per_s": tokens / TIMED_STEPS / seconds,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "B": b, "G": g, "T": t, "dtype": str(dtype).removeprefix("torch."),
            "precision": precision, "parallel": type(trainer.parallel).__name__,
        }  # fmt: skip

    return run


class one_gpu_fsdp2:  # noqa: N801 (used as a context manager, like contextlib's)
    """FSDP2 in a process group of one: `make_parallel` only wraps with more than one rank,
    so here `DataParallel` (FSDP2) is forced for the trainer built inside."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self):
        if not self.enabled:
            return None
        import torch.distributed as dist

        import grpo.distributed as distributed

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1)
        self._make_parallel = distributed.make_parallel
        distributed.make_parallel = distributed.DataParallel
        return distributed.DistributedConfig(strategy="fsdp2")

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        import torch.distributed as dist

        import grpo.distributed as distributed

        distributed.make_parallel = self._make_parallel
        dist.destroy_process_group()


def step_parts() -> dict[str, Callable[[], dict]]:
    parts = {}
    for shape in SHAPES:
        parts[f"step/{shape}/float32"] = step_part(shape, torch.float32)
        parts[f"step/{shape}/bfloat16"] = step_part(shape, torch.bfloat16)
        parts[f"step/{shape}/bf16-mixed"] = step_part(shape, torch.float32, "bf16-mixed")
        parts[f"step/{shape}/fsdp2-float32"] = step_part(shape, torch.float32, fsdp2=True)
        parts[f"step/{shape}/lora-bf16-mixed"] = step_part(
            shape, torch.float32, "bf16-mixed", lora=True
        )
    return parts


def all_parts() -> dict[str, Callable[[], dict]]:
    from gpu_check_train import TRAIN_PARTS
    from gpu_check_vllm import VLLM_PARTS

    return {**VLLM_PARTS, **step_parts(), **TRAIN_PARTS}


def why_skipped(name: str) -> str | None:
    """Why a part cannot run on this machine, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if name.startswith("vllm/") and importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    return None


def run_parts(names: list[str], budget_s: float) -> dict[str, dict]:
    parts, results, start = all_parts(), {}, time.perf_counter()
    for name in names:
        reason = why_skipped(name)
        if reason is None and time.perf_counter() - start > budget_s:
            reason = f"time budget of {budget_s:.0f} s spent"
        if reason is not None:
            results[name] = {"status": "skipped", "reason": reason}
            continue
        began = time.perf_counter()
        try:
            results[name] = parts[name]()
        except Exception as error:  # a failed part is a result; the others still run
            tail = traceback.format_exc().strip().splitlines()[-3:]
            results[name] = {"status": "failed", "reason": f"{error!r}", "traceback": tail}
        results[name]["seconds"] = time.perf_counter() - began
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def table(results: dict[str, dict]) -> str:
    rows = [f"{'part':34} {'status':8} {'s/step':>8} {'tokens/s':>10} {'peak GiB':>9}  notes"]
    for name, r in results.items():
        cells = [
            f"{r[k]:.3g}" if isinstance(r.get(k), float) else "-"
            for k in ("s_per_step", "tokens_per_s", "peak_gib")
        ]
        notes = r.get("reason") or r.get("summary", "")
        rows.append(f"{name:34} {r['status']:8} {cells[0]:>8} {cells[1]:>10} {cells[2]:>9}  {notes}")
    return "\n".join(rows)


def environment() -> dict:
    vllm = importlib.util.find_spec("vllm") is not None
    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "vllm": _version("vllm") if vllm else None,
        "cuda": torch.cuda.is_available(),
    }


def _version(package: str) -> str | None:
    import importlib.metadata

    for name in (package, f"{package}-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON goes")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting parts after")
    parser.add_argument("--parts", default="", help="comma-separated part names (default: all)")
    parser.add_argument("--record", help="also write the record bench/results/RECORD.json")
    parser.add_argument("--results", type=Path, help="the record's folder instead")
    args = parser.parse_args(argv)
    names = [p for p in args.parts.split(",") if p] or list(all_parts())
    started = time.perf_counter()
    results = run_parts(names, args.budget_s)
    report = {**environment(), "seconds": time.perf_counter() - started, "parts": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"{report['device']}, torch {report['torch']}, vLLM {report['vllm']}")
    print(table(results))
    print(f"JSON: {args.out}")
    if args.record:
        from records import RESULTS, write_record

        depends = ["bench/gpu_check.py", "bench/gpu_check_train.py", "bench/gpu_check_vllm.py",
                   "configs/demo.yaml", "grpo"]  # fmt: skip
        argv = ["bench/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]
        path = write_record(args.record, report, depends, argv=argv, folder=args.results or RESULTS)
        print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
