"""The folded output layer's work in one gradient pass: the padded block, two passes, against
the real tokens, one pass.

    python bench/output_layer_rows.py --threads 2 --reps 7

One group of G completions of ragged lengths (`--lengths`; the default is a
group of 8 of mean 52 tokens, one cut off at 128, as SmolLM2-135M-Instruct's
samples on the word-problem config average over a run) behind hidden states of width H = 576
and an output layer of V = 49152 rows (SmolLM2's shapes; random values: the
time does not depend on them). Timed, forward and backward of a loss on the
log-probs, entropy computed as a metric:

| recipe | what it runs |
|---|---|
| padded, two passes | `output_layer_logprobs` and `output_layer_entropy` over the (G, T) block padded to the longest completion |
| real, one pass | `output_layer_logprobs_entropy` over the real tokens only (what `grpo.lm.scoring` runs) |

Each repetition times both, alternating which goes first; printed: the median
seconds of each and the median of the per-repetition ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo.functional.output_layer import (
    output_layer_entropy,
    output_layer_logprobs,
    output_layer_logprobs_entropy,
)

H, V = 576, 49152
LENGTHS = (21, 30, 38, 44, 51, 57, 47, 128)  # mean 52, one cut off at 128


def _padded(hidden, weight, ids, real) -> float:
    start = time.perf_counter()
    logprobs = output_layer_logprobs(hidden, weight, ids)  # (G, T)
    entropy = output_layer_entropy(hidden, weight)  # a metric: no backward through it
    (logprobs * real).sum().backward()
    assert entropy.isfinite().all()
    return time.perf_counter() - start


def _real(hidden, weight, ids, real) -> float:
    start = time.perf_counter()
    mask = real.bool()
    logprobs, entropy = output_layer_logprobs_entropy(hidden[mask], weight, ids[mask])  # (R,)
    logprobs.sum().backward()
    assert entropy.isfinite().all()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    G, T = len(args.lengths), max(args.lengths)
    hidden = torch.randn(G, T, H, generator=gen).requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 0.05).requires_grad_()
    ids = torch.randint(0, V, (G, T), generator=gen)
    real = (torch.arange(T)[None, :] < torch.tensor(args.lengths)[:, None]).float()  # (G, T)
    recipes = {"padded, two passes": _padded, "real, one pass": _real}
    times: dict[str, list[float]] = {name: [] for name in recipes}
    for rep in range(args.reps + 1):  # the first repetition warms up and is dropped
        order = list(recipes) if rep % 2 == 0 else list(reversed(recipes))
        for name in order:
            hidden.grad = weight.grad = None
            seconds = recipes[name](hidden, weight, ids, real)
            if rep:
                times[name].append(seconds)
    tokens = int(real.sum())
    print(f"G {G}, T {T}: {tokens} real tokens of {G * T} ({tokens / (G * T):.2f}); "
          f"H {H}, V {V}, {args.threads} threads, {args.reps} repetitions")  # fmt: skip
    for name, values in times.items():
        print(f"{name:20s} median {statistics.median(values):.3f} s")
    ratios = [r / p for r, p in zip(times["real, one pass"], times["padded, two passes"], strict=True)]
    print(f"real / padded: median of ratios {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
