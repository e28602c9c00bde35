"""Shared prompts on the demo workload, side by side: each part with sharing on and off.

    python bench/shared_prefix.py --reps 21 --threads 1

The demo's model (grpo/assets/arith-tiny: a 4-layer Llama, hidden 128, vocabulary
18) and shapes (configs/demo.yaml: B = 32 arithmetic prompts x G = 8 samples of at
most 5 new tokens, temperature 1, one micro-batch of 256, no entropy). Parts, each
timed with and without sharing in one process, alternating (ABBA order), `--reps`
times; printed: the median seconds of each, the ratio of the medians (shared /
plain) and the median of the per-repetition ratios:

| part | shared | plain |
|---|---|---|
| score+backward | `share_prompt_prefix` on: the loss's gradient pass over a fixed rollout, `score_completions` with gradient then backward | off |
| score (no grad) | the same pass without gradient (old or reference log-probs) | off |
| rollout lean | `LeanEngine.sample` of the 256 rows, `share_prefill` on | off |
| step transformers | `GRPOTrainer.train_step` (demo's config, AdamW), transformers' `generate`, scoring shared | scoring plain |
| step lean | the same with the lean engine, scoring shared and prefill shared | both plain |
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
B, G, T = 32, 8, 5


def _policy(engine: str):
    from grpo.lm.engines import RolloutSettings
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    generation = GenerationSettings(max_new_tokens=T, temperature=1.0, top_p=1.0, top_k=0, seed=0)
    settings = CausalLMSettings(generation, micro_batch_size=B * G, compute_entropy=False)
    path = str(ROOT / "grpo" / "assets" / "arith-tiny")
    return CausalLMPolicy.from_pretrained(
        path, settings, dtype="float32", rollout=RolloutSettings(engine=engine)
    )


def _trainer(policy):
    from grpo import GRPOConfig, GRPOTrainer
    from grpo.rewards.combine import TextReward
    from grpo.tasks import arithmetic

    config = GRPOConfig(
        group_size=G, batch_size=B * G, num_epochs_per_update=1, aggregation="token_mean",
        kl_coeff=0.0, entropy_coeff=0.0, max_grad_norm=1.0,
    )  # fmt: skip
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=5e-4)
    return GRPOTrainer(policy, TextReward(arithmetic.reward), optimizer=optimizer, config=config)


def _states(step: int) -> list[dict[str, str]]:
    from grpo.tasks.arithmetic import ArithmeticConfig, generate_dataset

    config = ArithmeticConfig(num_operands=2, max_digits=2, operators=("+",))
    return generate_dataset(B, seed=1000 + step, config=config)


def _setters(policy) -> Callable[[bool], None]:
    """A switch turning every kind of sharing of this policy on or off."""

    def switch(on: bool) -> None:
        policy.settings.share_prompt_prefix = on
        decoder = getattr(policy.rollout_engine, "decoder", None)
        if decoder is not None:
            decoder.share_prefill = on

    return switch


def _parts() -> dict[str, tuple[Callable[[bool], None], Callable[[int], None]]]:
    """name -> (switch(on), run(rep)): what each part times."""
    from grpo.lm.scoring import score_completions

    default, lean = _policy("transformers"), _policy("lean")
    states = _states(0)
    with torch.no_grad():
        actions = [a for group in default.generate_actions(states, G) for a in group]
    advantages = torch.randn(len(actions), 1, generator=torch.Generator().manual_seed(0))

    def score_backward(rep: int) -> None:
        default.model.zero_grad(set_to_none=True)
        out, _ = score_completions(default.model, actions, default.scoring_settings())
        (out.logprobs * advantages).sum().div(out.completion_mask.sum()).neg().backward()

    def score_no_grad(rep: int) -> None:
        with torch.no_grad():
            score_completions(default.model, actions, default.scoring_settings())

    def rollout_lean(rep: int) -> None:
        with torch.no_grad():
            lean.generate_actions(_states(rep % 4), G)

    trainers = {"transformers": _trainer(default), "lean": _trainer(lean)}
    return {
        "score+backward": (_setters(default), score_backward),
        "score (no grad)": (_setters(default), score_no_grad),
        "rollout lean": (_setters(lean), rollout_lean),
        "step transformers": (
            _setters(default),
            lambda r: trainers["transformers"].train_step(_states(r)),
        ),
        "step lean": (_setters(lean), lambda r: trainers["lean"].train_step(_states(r))),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", default="", help="comma-separated part names; all if empty")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = _parts()
    chosen = [p for p in args.parts.split(",") if p] or list(parts)
    print(f"{args.reps} reps, {args.threads} threads, torch {torch.__version__}")
    print("| part | shared s | plain s | shared / plain (medians) | median of paired ratios |")
    print("|---|---|---|---|---|")
    for name in chosen:
        switch, run = parts[name]
        for on in (True, False):  # warm-up, and the first-use checks
            switch(on)
            run(0)
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(args.reps):
            for on in (True, False) if rep % 2 == 0 else (False, True):
                switch(on)
                start = time.perf_counter()
                run(rep + 1)
                times[on].append(time.perf_counter() - start)
        switch(True)
        shared, plain = (statistics.median(times[on]) for on in (True, False))
        paired = statistics.median(a / b for a, b in zip(times[True], times[False], strict=True))
        print(f"| {name} | {shared:.4f} | {plain:.4f} | {shared / plain:.3f} | {paired:.3f} |")


if __name__ == "__main__":
    main()
