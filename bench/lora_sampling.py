"""The lean engine's bfloat16 rollouts of a LoRA model: adapters merged into the copy, or not.

    python bench/lora_sampling.py --model "$(grpo fetch smollm2)"     # B=4 x G=8 x T=128, r=16

Under `rollout.precision: bf16-mixed` the lean engine samples with a bfloat16
copy of the model (`grpo.lm.engines.low_precision.LowPrecisionCopy`). For a
LoRA model that copy is the plain model with each adapted weight merged,
W + (alpha / r) B A, recomputed at every rollout. The alternative measured
here keeps peft's layers in the copy (the base product and two adapter
products, through peft's module, at every token), as the copy was built
before the merge. Both run in this process one after the other, alternating
for `--rounds` rounds from the same seed, after a warm-up rollout each. The
adapters' B matrices are drawn at random (as after training; at their zero
initialisation both copies are the base model). Reported: seconds per
rollout and generated tokens per second, the median over rounds.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from real_model_memory import _prompts  # noqa: E402

from grpo.lm.engines import RolloutSettings  # noqa: E402
from grpo.lm.engines.lean import LeanDecoder  # noqa: E402
from grpo.lm.engines.low_precision import LowPrecisionCopy  # noqa: E402
from grpo.lm.loading import LoraSettings, apply_lora, load_model_and_tokenizer  # noqa: E402
from grpo.lm.policy import CausalLMPolicy, CausalLMSettings  # noqa: E402
from grpo.lm.sampling import GenerationSettings  # noqa: E402


class UnmergedCopy(LowPrecisionCopy):
    """The bfloat16 copy with peft's layers kept: every matrix cast, adapters included."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.model = copy.deepcopy(model).requires_grad_(False)
        self.pairs = list(zip(self.model.parameters(), model.parameters(), strict=True))
        self.merged = []
        for mine, _ in self.pairs:
            if mine.dim() >= 2:
                mine.data = mine.data.to(dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a Llama-family model folder")
    parser.add_argument("-B", type=int, default=4)
    parser.add_argument("-G", type=int, default=8)
    parser.add_argument("-T", type=int, default=128)
    parser.add_argument("-r", type=int, default=16, help="LoRA rank (alpha = 2r)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype="float32")
    model = apply_lora(model, LoraSettings(r=args.r, alpha=2.0 * args.r))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    generation = GenerationSettings(max_new_tokens=args.T, temperature=0.7, seed=0)
    policy = CausalLMPolicy(
        model,
        tokenizer,
        CausalLMSettings(generation),
        RolloutSettings("lean", precision="bf16-mixed"),
    )
    engine, states = policy.rollout_engine, _prompts(args.B)
    policy.generate_actions(states, args.G)  # builds the merged copy and runs the self-check
    copies = {"merged": (engine.low, engine.low_decoder)}
    unmerged = UnmergedCopy(model, torch.bfloat16)
    copies["peft layers"] = (unmerged, LeanDecoder(unmerged.model, state_dtype=torch.float32))
    times: dict[str, list[float]] = {name: [] for name in copies}
    tokens: dict[str, list[float]] = {name: [] for name in copies}
    for round_ in range(args.rounds + 1):
        start = policy.sampling_state()  # both copies draw from the same seeds this round
        for name, (low, decoder) in copies.items():
            engine.low, engine.low_decoder = low, decoder
            policy.load_sampling_state(start)
            begin = time.perf_counter()
            groups = policy.generate_actions(states, args.G)
            seconds = time.perf_counter() - begin
            if round_ > 0:  # round 0 warms both up
                times[name].append(seconds)
                tokens[name].append(sum(a.num_tokens for g in groups for a in g) / seconds)
    print(f"B={args.B} G={args.G} T={args.T} r={args.r}, {args.threads} threads")
    print("| copy | s per rollout | tokens/s |\n|---|---|---|")
    for name in copies:
        print(f"| {name} | {statistics.median(times[name]):.2f} | "
              f"{statistics.median(tokens[name]):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
