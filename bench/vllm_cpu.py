"""The CPU parts of bench/vllm_rollout.py: vLLM's CPU build against the `transformers` and `lean` engines.

Each part runs in a fresh subprocess (its own peak RSS; vLLM's CPU worker also
replaces `torch.set_num_threads` for the whole process) and prints one JSON record.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "grpo" / "assets" / "arith-tiny"
WORDS = [*"abcdefghijklmnop", "say", "count", "red", "blue", "yes", "no", "the", "answer"]
WORKLOADS = {  # name -> (prompts B, completions per prompt G, new tokens at most, timed calls)
    "demo": (32, 8, 5, 5),
    "0.5b": (8, 8, 128, 1),
    "gemma": (4, 4, 64, 2),
}
# what a record's numbers depend on: the engines, what they share, and this benchmark
DEPENDS_ON = [
    "grpo/lm/engines/base.py", "grpo/lm/engines/transformers.py", "grpo/lm/engines/lean.py",
    "grpo/lm/engines/lean_families.py", "grpo/lm/engines/low_precision.py",
    "grpo/lm/engines/vllm_cpu.py", "grpo/lm/policy.py", "grpo/lm/sampling.py",
    "grpo/functional/sampling.py", "bench/vllm_cpu.py", "bench/vllm_rollout.py",
]  # fmt: skip
ENGINES = ("vllm", "transformers", "lean")


def _prompts(model: str, n: int) -> list[dict]:
    rng = random.Random(1)
    if model == "demo":
        return [{"prompt": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="} for _ in range(n)]
    return [{"prompt": " ".join(rng.choices(WORDS, k=rng.randint(8, 16)))} for _ in range(n)]


def _policy(folder: Path, engine: str, max_new_tokens: int):
    from grpo.lm.engines import RolloutSettings, VLLMSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    vllm = VLLMSettings(max_model_len=None if folder == DEMO else 256, engine_kwargs={"kv_cache_memory_bytes": 1 << 30})
    rollout = RolloutSettings(engine=engine, vllm=vllm)
    generation = GenerationSettings(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
    settings = CausalLMSettings(generation, micro_batch_size=64)
    return CausalLMPolicy.from_pretrained(str(folder), settings, dtype="float32", rollout=rollout)


def part(folder: Path, model: str, engine: str, threads: int) -> dict:
    """Rollout tokens/s of one engine on one model; for vLLM also its weight-update time."""
    torch.set_num_threads(threads)  # before vLLM replaces it
    B, G, max_new, calls = WORKLOADS[model]
    start = time.perf_counter()
    policy = _policy(folder, engine, max_new)
    build_s = time.perf_counter() - start
    policy.generate_actions(_prompts(model, 2), 2, max_new_tokens=4)  # warm-up
    elapsed, tokens = 0.0, 0
    for _ in range(calls):
        start = time.perf_counter()
        groups = policy.generate_actions(_prompts(model, B), G)
        elapsed += time.perf_counter() - start
        tokens += sum(a.num_tokens for g in groups for a in g)
    record = {
        "model": model,
        "engine": engine,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "rollout_tokens_per_s": tokens / elapsed,
        "rollout_s": elapsed / calls,
        "mean_completion_tokens": tokens / (calls * B * G),
        "build_s": build_s,
    }
    if engine == "vllm":
        engine_ = policy.rollout_engine
        syncs = []
        for _ in range(3):
            with torch.no_grad():
                for p in policy.model.parameters():
                    p.mul_(1.0001)  # a new version of every weight, as after a step
            start = time.perf_counter()
            engine_.sync()  # reload, prefix-cache reset, probe check
            syncs.append(time.perf_counter() - start)
        record.update(sync_s=min(syncs), probe_gap=engine_.probe_gap, checks=engine_.checks)
    record["peak_rss_gib"] = peak_rss_gib()
    return record


def peak_rss_gib() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not carried over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    return float("nan")


def run_cpu(args, build_folder, shapes: dict[str, dict], script: str) -> None:
    """Every CPU part (of `args.models` x `args.engines`) in its own subprocess, or the one
    `args.part` names, then a table; `shapes`: the random models' configs, by workload."""
    root = args.folder or Path(tempfile.mkdtemp(prefix="grpo-vllm-bench-"))
    folders = {"demo": DEMO, "0.5b": root / "qwen2-0.5b-shape", "gemma": root / "gemma3-270m-shape"}
    if args.gemma:  # a model of your own is measured as it is, never built in its place
        folders["gemma"] = Path(args.gemma).expanduser()
        if not (folders["gemma"] / "config.json").is_file():
            raise SystemExit(f"--gemma {args.gemma}: no model folder (config.json) there")
    if args.part:
        model, engine = args.part.rsplit("-", 1)
        print(json.dumps(part(folders[model], model, engine, args.threads)))
        return
    models = args.models or list(WORKLOADS)
    for model in models:
        if model in shapes and not (folders[model] / "config.json").exists():
            build_folder(folders[model], shapes[model])
    results = {}
    for model in models:
        for engine in args.engines or ENGINES:
            name = f"{model}-{engine}"
            command = [sys.executable, script, "--part", name, "--folder", str(root),
                       "--threads", str(args.threads)]  # fmt: skip
            if args.gemma:
                command += ["--gemma", str(args.gemma)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
                continue
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            results[name]["folder"] = folders[model].name  # a random shape or the model given
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    print(table(results))
    if args.record:
        from records import RESULTS, write_record

        path = write_record(args.record, results, DEPENDS_ON, folder=args.results or RESULTS)
        print(f"record: {path}")


def table(results: dict[str, dict]) -> str:
    """One row a part; "x transformers": its tokens/s over the transformers engine's on the
    same model."""
    rows = [
        "| model | engine | tokens/s | x transformers | rollout s | mean tokens | weight update s "
        "| peak RSS GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        sync = f"{r['sync_s']:.3f}" if "sync_s" in r else "-"
        base = results.get(f"{r['model']}-transformers")
        ratio = f"{r['rollout_tokens_per_s'] / base['rollout_tokens_per_s']:.2f}" if base else "-"
        rows.append(
            f"| {r['model']} | {r['engine']} | {r['rollout_tokens_per_s']:.0f} | {ratio} | "
            f"{r['rollout_s']:.2f} | {r['mean_completion_tokens']:.1f} | {sync} | "
            f"{r['peak_rss_gib']:.2f} |"
        )
    return "\n".join(rows)
