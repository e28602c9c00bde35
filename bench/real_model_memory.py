"""Peak memory of one whole GRPO training step on a real model, with and without a folded output layer.

    python bench/real_model_memory.py --model "$(grpo fetch smollm2)"        # B=4 x G=4 x T=64
    python bench/real_model_memory.py --model DIR -B 8 -G 8 -T 128 --engines lean
    python bench/real_model_memory.py --model DIR --code OLD_CHECKOUT --fold false

Every setting (engine x top-p x `policy.chunked_output_layer`) runs in a fresh
subprocess, one at a time: the model and its tokenizer load, the trainer is
built with the text runs' defaults (`grpo.run.config.default_grpo`: KL to a
frozen reference copy, one pass per rollout) and one mini-batch of all N =
B x G samples, the peak-RSS counter is reset (Linux `/proc/self/clear_refs`),
then one `train_step` runs: sampling, rewards, the no-grad passes (old and
reference log-probs) and the gradient pass, Adam's first step included (its
state is allocated there). Reported: the peak resident memory of the step
(VmHWM), what it adds to the memory before the step, the peak up to the
optimizer step (sampling and the three scoring passes), its seconds and the
mean completion length. The
same seed draws the same tokens whether the output layer is folded or not.

`--code DIR` runs the settings against another checkout of `grpo` (its
folder goes first on PYTHONPATH), e.g. an older commit, for a before/after.
Prompts are chat messages through the model's chat template.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline_memory import reset_peak, status_bytes  # noqa: E402

PROBLEMS = (
    "Tom has {a} apples and buys {b} more. How many apples does he have now?",
    "A box holds {a} pens. {b} pens are taken out. How many pens are left?",
    "Sara reads {a} pages a day for {b} days. How many pages does she read?",
    "There are {a} birds on a tree and {b} fly away. How many birds stay?",
)


def _prompts(B: int) -> list[dict]:
    """B chat prompts, each a short word problem asking for reasoning (long completions)."""
    rows = []
    for i in range(B):
        text = PROBLEMS[i % len(PROBLEMS)].format(a=12 + 7 * i, b=3 + 2 * i)
        ask = " Explain your reasoning step by step, in detail, before the answer."
        messages = [{"role": "user", "content": text + ask}]
        rows.append({"prompt": messages})
    return rows


def measure(model: str, engine: str, top_p: float, fold: str, shape: tuple, threads: int) -> dict:
    """One training step in this process -> its peak memory and seconds."""
    import torch

    B, G, T = shape
    torch.set_num_threads(threads)

    from grpo.lm.engines import RolloutSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings
    from grpo.rewards.combine import TextReward
    from grpo.run.config import default_grpo
    from grpo.step.trainer import GRPOTrainer

    torch.manual_seed(0)
    generation = GenerationSettings(max_new_tokens=T, temperature=1.0, top_p=top_p, seed=0)
    chunked = {"true": True, "false": False}.get(fold, fold)
    settings = CausalLMSettings(generation, chunked_output_layer=chunked)
    policy = CausalLMPolicy.from_pretrained(model, settings, rollout=RolloutSettings(engine))
    config = dataclasses.replace(
        default_grpo(), group_size=G, batch_size=B * G, skip_zero_advantage=False
    )
    reward = TextReward(lambda prompts, completions, **_: [float(len(c)) for c in completions])
    trainer = GRPOTrainer(policy, reward, None, config)
    before = status_bytes("VmRSS")
    if not reset_peak():  # the peak-RSS counter restarts here
        raise SystemExit("this kernel does not let a process reset its peak RSS (clear_refs)")
    marks = {}
    optimizer_step = trainer.optimizer.step

    def marked_step(*args, **kwargs):  # the peak of everything before the optimizer step
        marks.setdefault("before_optimizer", status_bytes("VmHWM"))
        return optimizer_step(*args, **kwargs)

    trainer.optimizer.step = marked_step
    start = time.perf_counter()
    trainer.train_step(_prompts(B))
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    V = policy.model.get_output_embeddings().weight.shape[0]
    return {
        "engine": engine,
        "top_p": top_p,
        "chunked_output_layer": fold,
        "shape": [B, G, T, V],
        "rss_before_mib": before / 2**20,
        "step_peak_mib": peak / 2**20,
        "step_adds_mib": (peak - before) / 2**20,
        "before_optimizer_peak_mib": marks["before_optimizer"] / 2**20,
        "seconds": seconds,
        "length_mean": policy.rollout_metrics["completion/length_mean"],
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a saved causal LM folder")
    parser.add_argument("-B", type=int, default=4)
    parser.add_argument("-G", type=int, default=4)
    parser.add_argument("-T", type=int, default=64)
    parser.add_argument("--engines", nargs="+", default=["transformers", "lean"])
    parser.add_argument("--top-p", nargs="+", type=float, default=[1.0, 0.9])
    parser.add_argument("--fold", nargs="+", default=["false", "auto"], help="true, false, auto")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--code", help="another checkout of grpo to measure (default: this one)")
    parser.add_argument("--one", action="store_true", help="run one setting in this process")
    args = parser.parse_args()
    shape = ["-B", str(args.B), "-G", str(args.G), "-T", str(args.T), "--threads", str(args.threads)]
    if args.one:
        step = (args.B, args.G, args.T)
        row = measure(args.model, args.engines[0], args.top_p[0], args.fold[0], step, args.threads)
        print(json.dumps(row))
        return
    code = Path(args.code or Path(__file__).resolve().parents[1]).resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
    for engine, top_p, fold in itertools.product(args.engines, args.top_p, args.fold):
        setting = ["--engines", engine, "--top-p", str(top_p), "--fold", fold]
        command = [sys.executable, __file__, "--model", args.model, *shape, *setting, "--one"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=code)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            continue
        row = {**json.loads(done.stdout.strip().splitlines()[-1]), "code": str(code)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
