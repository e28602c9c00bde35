"""Drawing the next token: `grpo.functional.draw_indices` against `torch.multinomial`.

    python bench/token_draw.py                                        # the draw alone
    python bench/token_draw.py --model "$(grpo fetch smollm2)"        # and whole rollouts

Every generated token of the lean engine draws one index per row from (rows, V)
probabilities. `torch.multinomial` draws one exponential per entry; `draw_indices`
one uniform per row, located among the row's running sums. First the draw alone
at B x G rows and `--vocab` entries (the median of 50 calls after a warm-up);
then, with `--model`, whole bfloat16-mixed lean rollouts of B prompts x G
samples x T tokens at temperature 0.7 with each draw, alternating for
`--rounds` rounds after a warm-up each. The two draws consume the random
stream differently, so the samples (and their lengths) differ: compare
generated tokens per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from real_model_memory import _prompts  # noqa: E402

import grpo.functional.sampling as sampling  # noqa: E402


def multinomial(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """torch's own draw, as the lean engine drew before `draw_indices`: (n, V) -> (n,)."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


DRAWS: dict[str, Callable] = {
    "draw_indices": sampling.draw_indices,
    "torch.multinomial": multinomial,
}


def time_draw_alone(rows: int, vocab: int) -> dict[str, float]:
    """Milliseconds per call of each draw on a tempered softmax of random logits."""
    torch.manual_seed(0)
    probs = (torch.randn(rows, vocab) * 3 / 0.7).softmax(-1)  # (rows, V)
    out = {}
    for name, draw in DRAWS.items():
        draw(probs)
        times = []
        for _ in range(50):
            begin = time.perf_counter()
            draw(probs)
            times.append(time.perf_counter() - begin)
        out[name] = 1e3 * statistics.median(times)
    return out


def time_rollouts(folder: str, B: int, G: int, T: int, rounds: int) -> dict[str, list[float]]:
    """Generated tokens per second of whole lean rollouts with each draw."""
    from grpo.lm.engines import RolloutSettings
    from grpo.lm.loading import load_model_and_tokenizer
    from grpo.lm.policy import CausalLMPolicy, CausalLMSettings
    from grpo.lm.sampling import GenerationSettings

    model, tokenizer = load_model_and_tokenizer(folder, dtype="float32")
    generation = GenerationSettings(max_new_tokens=T, temperature=0.7, seed=0)
    settings = RolloutSettings("lean", precision="bf16-mixed")
    policy = CausalLMPolicy(model, tokenizer, CausalLMSettings(generation), settings)
    states = _prompts(B)
    rates: dict[str, list[float]] = {name: [] for name in DRAWS}
    for round_ in range(rounds + 1):
        for name, draw in DRAWS.items():
            sampling.draw_indices = draw  # choose_tokens looks the name up at each call
            begin = time.perf_counter()
            groups = policy.generate_actions(states, G)
            seconds = time.perf_counter() - begin
            if round_ > 0:  # round 0 warms both up
                rates[name].append(sum(a.num_tokens for g in groups for a in g) / seconds)
    sampling.draw_indices = DRAWS["draw_indices"]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a Llama-family model folder: also time whole rollouts")
    parser.add_argument("-B", type=int, default=4)
    parser.add_argument("-G", type=int, default=8)
    parser.add_argument("-T", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152, help="SmolLM2's vocabulary size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = args.B * args.G
    print(f"{rows} rows x {args.vocab} entries, {args.threads} threads")
    print("| draw | ms per call |\n|---|---|")
    for name, ms in time_draw_alone(rows, args.vocab).items():
        print(f"| {name} | {ms:.2f} |")
    if args.model:
        rates = time_rollouts(args.model, args.B, args.G, args.T, args.rounds)
        print(f"\nrollouts: B={args.B} G={args.G} T={args.T}, median of {args.rounds} rounds")
        print("| draw | generated tokens/s |\n|---|---|")
        for name, values in rates.items():
            print(f"| {name} | {statistics.median(values):.0f} |")


if __name__ == "__main__":
    main()
