"""The folded output layer's matrix products in float32 and in bfloat16, side by side.

    python bench/output_layer_precision.py --record output_layer_precision
    python bench/output_layer_precision.py --reps 3 --threads 2     # a quick look

`grpo.functional.output_layer` multiplies hidden states by the output weight chunk by chunk
(the logits in forward, the logits again and the hidden states' gradient in backward; the
weight's own gradient, where it trains, is summed in float32 either way). Given a
`product_weight`, a bfloat16 cast of the weight, those products read it in bfloat16; the
softmax is float32 either way. The policy passes one under bf16-mixed and bf16-copy
(`grpo.lm.scoring`), cast once per change of the weight (`grpo.precision.cast_once`), so the
cast is timed apart, not in each pass. Timed here on each real model's shape, with float32
master weights:

| shape | H | V | output layer |
|---|---|---|---|
| SmolLM2-135M | 576 | 49,152 | trained (configs/smollm2_math.yaml) |
| Gemma 3 270M | 640 | 262,144 | frozen, tied to the frozen embedding (configs/gemma3_math.yaml) |

Rows: one micro-batch's completion tokens, 8 completions of 44 tokens (what both configs
drew per completion in `bench/roofline.py`'s steps). Each repetition runs forward (log-probs
and entropy in one pass, as `grpo.lm.scoring` does) and backward of the log-probs' sum, once
per dtype, alternating which goes first; the first repetition warms up and is dropped.
Recorded: each dtype's median seconds, the per-repetition ratio bfloat16 / float32 and its
median, the work (2 H V FLOPs per row and product) as GFLOP/s, the largest difference
between the two dtypes' log-probs, and the median seconds of one cast of the weight.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grpo.functional.output_layer import output_layer_logprobs_entropy

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {  # name -> (H, V, the output layer trains)
    "SmolLM2-135M": (576, 49_152, True),
    "Gemma 3 270M": (640, 262_144, False),
}
ROWS = 8 * 44
DTYPES = ("float32", "bfloat16")
DEPENDS = ["grpo/functional/output_layer.py", "grpo/functional/logprobs.py",
           "bench/output_layer_precision.py"]  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="completion tokens scored")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions, after one")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--record", metavar="NAME", help="write bench/results/NAME.json")
    return parser.parse_args(argv)


def _pass(hidden, weight, ids, product_weight) -> tuple[float, torch.Tensor]:
    """Seconds of one forward and backward, and the log-probs (R,)."""
    hidden.grad = weight.grad = None
    start = time.perf_counter()
    logprobs, entropy = output_layer_logprobs_entropy(
        hidden, weight, ids, product_weight=product_weight
    )  # (R,) each; entropy a metric: no backward through it
    logprobs.sum().backward()
    seconds = time.perf_counter() - start
    if not bool(entropy.isfinite().all()):
        raise RuntimeError("output_layer_precision: a non-finite entropy")
    return seconds, logprobs.detach()


def measure_shape(H: int, V: int, trains: bool, rows: int, reps: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, H, generator=gen).requires_grad_()  # (R, H)
    weight = (torch.randn(V, H, generator=gen) * 0.05).requires_grad_(trains)  # (V, H)
    ids = torch.randint(0, V, (rows,), generator=gen)  # (R,)
    times: dict[str, list[float]] = {name: [] for name in DTYPES}
    casts: list[float] = []
    logprobs: dict[str, torch.Tensor] = {}
    for rep in range(reps + 1):
        start = time.perf_counter()
        low = weight.detach().bfloat16()  # (V, H): the cast, once per change of the weight
        casts.append(time.perf_counter() - start)
        product = {"float32": None, "bfloat16": low}
        order = list(DTYPES) if rep % 2 == 0 else list(reversed(DTYPES))
        for name in order:
            seconds, logprobs[name] = _pass(hidden, weight, ids, product[name])
            if rep:
                times[name].append(seconds)
    ratios = [b / f for b, f in zip(times["bfloat16"], times["float32"], strict=True)]
    products = 4 if trains else 3  # logits, logits again, hidden's gradient (, weight's)
    gflop = 2 * rows * H * V * products / 1e9
    return {
        "H": H, "V": V, "output_layer_trains": trains, "rows": rows, "gflop": gflop,
        "seconds": times, "ratios": ratios, "median_ratio": statistics.median(ratios),
        "median_seconds": {name: statistics.median(values) for name, values in times.items()},
        "logprob_gap_max": (logprobs["bfloat16"] - logprobs["float32"]).abs().max().item(),
        "cast_seconds": statistics.median(casts[1:]),
    }  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    shapes = {name: measure_shape(H, V, trains, args.rows, args.reps)
              for name, (H, V, trains) in SHAPES.items()}  # fmt: skip
    return {"threads": args.threads, "reps": args.reps, "rows": args.rows, "shapes": shapes}


def table(results: dict[str, Any]) -> str:
    lines = ["| shape | output layer | float32 products s | bfloat16 products s | "
             "x float32 (median of repetitions) | GFLOP/s float32, bfloat16 | "
             "largest log-prob difference | one cast of the weight s |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, shape in results["shapes"].items():
        f32, b16 = shape["median_seconds"]["float32"], shape["median_seconds"]["bfloat16"]
        rates = f"{shape['gflop'] / f32:.0f}, {shape['gflop'] / b16:.0f}"
        layer = f"{shape['V']:,} x {shape['H']}, " + ("trained" if shape["output_layer_trains"]
                                                       else "frozen")  # fmt: skip
        lines.append(f"| {name} | {layer} | {f32:.3f} | {b16:.3f} | {shape['median_ratio']:.2f} "
                     f"| {rates} | {shape['logprob_gap_max']:.3g} "
                     f"| {shape['cast_seconds']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def note(results: dict[str, Any]) -> str:
    """What the table measured, in one paragraph."""
    return (
        f"One micro-batch of {results['rows']} completion tokens with random float32 hidden "
        "states and weights: log-probs and entropy in one pass, backward of the log-probs' "
        f"sum, at {results['threads']} threads; medians of {results['reps']} repetitions "
        "after one untimed, the two dtypes alternating within each. bfloat16 reads a cast of "
        "the weight made before the pass (a run makes it once per optimizer step, or once "
        "for a frozen weight; its time is the last column). GFLOP/s counts 2 H V FLOPs per "
        "row for each product (logits, logits again in backward, the hidden states' "
        "gradient, and the weight's where it trains) over the whole pass, softmax included. "
        "The difference compares the two dtypes' log-probs of the same rows."
    )


def main(argv: Sequence[str] | None = None, folder: Path | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = measure(args)
    from provenance import table_and_note

    print(table_and_note(table, note, results))
    if args.record:
        from records import RESULTS, write_script_record

        script = "bench/output_layer_precision.py"
        write_script_record(args.record, results, DEPENDS, script, argv, folder or RESULTS)
    return results


if __name__ == "__main__":
    main()
