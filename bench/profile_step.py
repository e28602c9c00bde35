"""Where one `grpo` optimizer step spends its time: cProfile over timed `train_step` calls.

    python bench/profile_step.py --model small -B 4 -G 4 -T 32 --steps 3 [--engine lean]

Prints the phases (sampling, old-log-prob scoring, rewards, loss forward,
backward, optimizer) as shares of the step, then cProfile's top functions by
cumulative time. The model is the benchmark's (`common.build_model`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import MODEL_SIZES, build_model, prompts, yes_reward  # noqa: E402

PHASES = {  # phase -> (module, attribute) wrapped with a timer
    "sampling": ("grpo.lm.engines.base", "TransformersEngine.sample"),
    "sampling (lean)": ("grpo.lm.engines.lean", "LeanEngine.sample"),
    "scoring (all passes)": (
        "grpo.lm.policy",
        "CausalLMPolicy.get_token_log_probabilities",
    ),
    "rewards": ("grpo.rewards.combine", "TextReward.compute_rewards"),
    "backward": ("torch", "Tensor.backward"),
    "optimizer": ("torch.optim", "AdamW.step"),
}


def _timed(totals: dict[str, float], name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    return wrapper


def main() -> None:
    import importlib

    from grpo import GRPOConfig, GRPOTrainer
    from grpo.lm.engines import ENGINE_NAMES, RolloutSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings
    from grpo.rewards.combine import TextReward

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="small", choices=sorted(MODEL_SIZES))
    parser.add_argument("-B", type=int, default=4)
    parser.add_argument("-G", type=int, default=4)
    parser.add_argument("-T", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--engine", default="transformers", choices=ENGINE_NAMES)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    totals: dict[str, float] = defaultdict(float)
    for name, (module, attr) in PHASES.items():
        owner_name, method = attr.split(".")
        owner = getattr(importlib.import_module(module), owner_name)
        setattr(owner, method, _timed(totals, name, getattr(owner, method)))
    N = args.B * args.G
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / args.model, args.model)
        generation = GenerationSettings(max_new_tokens=args.T, seed=0)
        settings = CausalLMSettings(
            generation=generation, micro_batch_size=N, compute_entropy=False
        )
        rollout = RolloutSettings(engine=args.engine)
        policy = CausalLMPolicy.from_pretrained(
            str(model_dir), settings, dtype="float32", rollout=rollout
        )
    config = GRPOConfig(group_size=args.G, batch_size=N, num_epochs_per_update=1, kl_coeff=0.0)
    config.entropy_coeff = 0.0
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-5, weight_decay=0.0)
    trainer = GRPOTrainer(policy, TextReward(yes_reward), optimizer=optimizer, config=config)
    texts = prompts(args.B * (args.steps + 1))
    trainer.train_step([{"prompt": p} for p in texts[: args.B]])  # warm-up
    totals.clear()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for step in range(1, args.steps + 1):
        trainer.train_step([{"prompt": p} for p in texts[step * args.B : (step + 1) * args.B]])
    profiler.disable()
    wall = time.perf_counter() - start
    print(f"{args.steps} steps, {wall / args.steps:.3f} s/step (under cProfile)")
    for name, seconds in totals.items():
        print(f"  {name:<22} {seconds / args.steps:.3f} s/step  {100 * seconds / wall:5.1f} %")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
