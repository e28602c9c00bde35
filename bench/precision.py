"""float32, pure bfloat16 and bf16-mixed side by side: s/step, peak memory, weights changed.

    python bench/precision.py kernels              # forward + backward: fp32, autocast, bf16 copy
    python bench/precision.py steps --rounds 2     # GRPO steps on SmolLM2-135M-Instruct
    python bench/precision.py demo --steps 200 --seeds 0 1 2   # the demo's accuracy

Variants (`VARIANTS`): "float32" (weights and compute float32), "pure-bf16"
(`model.dtype: bfloat16`: weights, gradients and Adam state in bfloat16) and
"bf16-mixed" (`policy.precision: bf16-mixed`: float32 weights and optimizer
state, bfloat16 autocast). `steps` runs each variant in its own process (for
its peak memory), interleaved A, B, C, A, B, C so a load change on a shared
machine hits every variant alike; ratios to float32 are per round. The model
is SmolLM2-135M-Instruct from --model when that folder exists, else random
weights of its shape (LlamaConfig below). Per step it records the share of
trainable weights whose stored value the step changed; at the end, the share
that differs from the start once both are rounded to bfloat16 (what a
bfloat16 export of the weights would show).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import peak_rss_mib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> (model dtype, policy.precision)
    "float32": ("float32", "fp32"),
    "pure-bf16": ("bfloat16", "fp32"),
    "bf16-mixed": ("float32", "bf16-mixed"),
}
SMOLLM2_SHAPE = dict(  # SmolLM2-135M's config, for random weights when the folder is absent
    hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
    max_position_embeddings=2048,
)  # fmt: skip
TOPICS = ["rivers", "bread", "clocks", "owls", "glass", "maps", "tea", "snow", "bees", "ships"]


def load(model_dir: str, dtype: str):
    """(model, tokenizer): the real folder if present, else random weights of SmolLM2's shape
    with the tokenizer of the GGUF-free test vocabulary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    if Path(model_dir, "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        return model, AutoTokenizer.from_pretrained(model_dir), "real weights"
    from common import build_tokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_SHAPE))
    return model.to(getattr(torch, dtype)), build_tokenizer(), "random weights"


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}]


def worker(args: argparse.Namespace) -> dict:
    """One variant's GRPO steps in this process -> its record (printed as JSON)."""
    from grpo import GRPOConfig, GRPOTrainer
    from grpo.lm.engines import RolloutSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings
    from grpo.rewards.combine import TextReward

    torch.set_num_threads(args.threads)
    dtype, precision = VARIANTS[args.variant]
    model, tokenizer, source = load(args.model, dtype)
    N = args.B * args.G
    generation = GenerationSettings(max_new_tokens=args.T, seed=0)
    settings = CausalLMSettings(generation, micro_batch_size=N, compute_entropy=False,
                                precision=precision)  # fmt: skip
    policy = CausalLMPolicy(model, tokenizer, settings, RolloutSettings(engine=args.engine))
    config = GRPOConfig(group_size=args.G, batch_size=N, kl_coeff=0.0, entropy_coeff=0.0,
                        num_epochs_per_update=1)  # one optimizer step per rollout (the CLI's)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    reward = TextReward(lambda prompts, completions, **_: [len(c) / 100 for c in completions])
    trainer = GRPOTrainer(policy, reward, optimizer=optimizer, config=config)
    start_bf16 = [p.detach().bfloat16() for p in model.parameters()]
    times, changed, lengths, phases = [], [], [], []
    for step in range(args.steps + 1):  # step 0 warms up, untimed
        states = [prompt(step * args.B + i) for i in range(args.B)]
        before = [p.detach().clone() for p in model.parameters()]
        t0 = time.perf_counter()
        metrics = trainer.train_step(states)
        seconds = time.perf_counter() - t0
        moved = sum(
            int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before, strict=True)
        )
        total = sum(b.numel() for b in before)
        if step:
            times.append(seconds)
            changed.append(moved / total)
            lengths.append(policy.rollout_metrics["completion/length_mean"])
            phases.append({k[5:]: v for k, v in metrics.items() if k.startswith("time/")})
    differs = sum(
        int((p.detach().bfloat16() != s).sum())
        for p, s in zip(model.parameters(), start_bf16, strict=True)
    )
    return {
        "variant": args.variant, "source": source, "s_per_step": statistics.median(times),
        "times": times, "peak_rss_gib": peak_rss_mib() / 1024, "changed_per_step": changed,
        "differs_from_start_bf16": differs / sum(s.numel() for s in start_bf16),
        "length_mean": statistics.mean(lengths),
        "phases": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
    }  # fmt: skip


def steps(args: argparse.Namespace) -> None:
    """Every variant in its own process, interleaved over `rounds`; a table of the medians."""
    records = []
    for r in range(args.rounds):
        for variant in VARIANTS:
            cmd = [sys.executable, "-u", __file__, "worker", "--variant", variant, "--model", args.model,
                   "--steps", str(args.steps), "-B", str(args.B), "-G", str(args.G),
                   "-T", str(args.T), "--lr", str(args.lr), "--engine", args.engine]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
            record = json.loads(out.strip().splitlines()[-1]) | {"round": r}
            records.append(record)
            print(json.dumps(record), flush=True)
    print(
        "| variant | s/step (median of rounds) | vs float32 (per round) | peak RSS GiB | "
        "weights changed per step | differ from start in bf16 | completion length | phases s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = {r["round"]: r["s_per_step"] for r in records if r["variant"] == "float32"}
    for variant in VARIANTS:
        rows = [r for r in records if r["variant"] == variant]
        ratios = ", ".join(f"{r['s_per_step'] / base[r['round']]:.2f}" for r in rows)
        changed = statistics.mean(c for r in rows for c in r["changed_per_step"])
        print(f"| {variant} | {statistics.median(r['s_per_step'] for r in rows):.1f} | {ratios} | "
              f"{max(r['peak_rss_gib'] for r in rows):.2f} | {changed:.2%} | "
              f"{statistics.mean(r['differs_from_start_bf16'] for r in rows):.2%} | "
              f"{statistics.mean(r['length_mean'] for r in rows):.0f} | "
              + ", ".join(f"{k} {statistics.median(r['phases'][k] for r in rows):.1f}"
                          for k in rows[0]["phases"] if k not in ("step", "other")) + " |")  # fmt: skip


def kernels(args: argparse.Namespace) -> None:
    """Forward + backward of N rows of P + T tokens: float32, autocast over float32 weights,
    and a bfloat16 copy of the model (the compute-copy alternative, without its copying)."""
    torch.set_num_threads(args.threads)
    model, _, source = load(args.model, "float32")
    copy = load(args.model, "bfloat16")[0]
    ids = torch.randint(0, 49152, (args.B * args.G, 24 + args.T))  # (N, P + T)
    runs = {
        "float32": (model, torch.autocast("cpu", enabled=False)),
        "autocast bf16": (model, torch.autocast("cpu", dtype=torch.bfloat16)),
        "bf16 copy": (copy, torch.autocast("cpu", enabled=False)),
    }
    times = {name: [] for name in runs}
    for _ in range(args.rounds + 1):  # the first round warms up
        for name, (net, context) in runs.items():
            net.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            with context:
                logits = net(input_ids=ids).logits
            logits.float().logsumexp(-1).mean().backward()
            times[name].append(time.perf_counter() - t0)
    print(f"{source}; {ids.shape[0]} rows x {ids.shape[1]} tokens, forward + backward")
    for name, ts in times.items():
        ratio = statistics.median(t / f for t, f in zip(ts[1:], times["float32"][1:], strict=True))
        print(f"| {name} | {statistics.median(ts[1:]):.2f} s | {ratio:.2f} |")


def demo(args: argparse.Namespace) -> None:
    """`grpo train configs/demo.yaml` for every variant and seed at equal steps, interleaved;
    the final held-out greedy accuracy of each run."""
    sets = {"float32": [], "pure-bf16": ["model.dtype=bfloat16"],
            "bf16-mixed": ["policy.precision=bf16-mixed"]}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for variant, extra in sets.items():
                run_dir = Path(tmp) / f"{variant}-{seed}"
                overrides = [f"schedule.num_steps={args.steps}", f"seed={seed}",
                             f"run.dir={run_dir}", "evaluation.every=0", *extra]  # fmt: skip
                cmd = [sys.executable, "-m", "grpo", "train", "configs/demo.yaml"]
                cmd += [a for o in overrides for a in ("--set", o)]
                subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
                summary = json.loads((run_dir / "summary.json").read_text())
                record = {"variant": variant, "seed": seed, "steps": args.steps,
                          "before": summary["before"]["eval/greedy/accuracy"],
                          "accuracy": summary["after"]["eval/greedy/accuracy"],
                          "run_s": summary["seconds"]}  # fmt: skip
                print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=["kernels", "steps", "demo", "worker"])
    parser.add_argument(
        "--model",
        default=os.path.expanduser("~/.cache/grpo/models/SmolLM2-135M-Instruct-dequantized-Q4_1"),
        help="a Hugging Face folder (default: where `grpo fetch smollm2` writes)",
    )
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("-B", type=int, default=4)
    parser.add_argument("-G", type=int, default=4)
    parser.add_argument("-T", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--engine", default="lean")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.part == "worker":
        print(json.dumps(worker(args)))
    else:
        {"kernels": kernels, "steps": steps, "demo": demo}[args.part](args)


if __name__ == "__main__":
    main()
