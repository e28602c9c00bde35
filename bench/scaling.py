"""How a `grpo` step's time grows with G, completion length T and model size.

    python bench/scaling.py            # B=4; G in 2,4,8; T in 16,32,64; small, medium, large
    python bench/scaling.py --steps 1  # quicker, noisier

One axis varies at a time around the base workload (small model, G=4,
T=32); each point runs both rollout engines, "grpo" (transformers `generate`)
and "grpo_lean" (the lean loop), one after the other, each in a fresh
subprocess (`grpo_vs_trl.run_once`) with one warm-up and `--steps` timed
optimizer steps; the median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODEL_SIZES, build_model  # noqa: E402
from grpo_vs_trl import OURS, run_once  # noqa: E402

BASE = {"model": "small", "G": 4, "T": 32}
AXES = {"G": (2, 4, 8), "T": (16, 32, 64), "model": ("small", "medium", "large")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-B", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    points = []
    for axis, values in AXES.items():
        for value in values:
            point = {**BASE, axis: value}
            if point not in points:
                points.append(point)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in points:
            model_dir = build_model(Path(tmp) / point["model"], point["model"])
            argv = ["--model", point["model"], "-B", str(args.B), "-G", str(point["G"])]
            argv += ["-T", str(point["T"]), "--steps", str(args.steps)]
            argv += ["--threads", str(args.threads)]
            records = {name: run_once(name, model_dir, argv) for name in OURS}
            step_s = {name: statistics.median(r["step_s"]) for name, r in records.items()}
            tokens = statistics.mean(records["grpo"]["tokens"])
            rows.append((point, step_s, tokens))
            print(point, {name: f"{s:.3f} s/step" for name, s in step_s.items()}, flush=True)
    print(
        "| model (hidden x layers) | G | T | N = B x G | tokens/step | s/step, transformers "
        "| s/step, lean | lean / transformers |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for point, step_s, tokens in rows:
        hidden, _, layers, _, _ = MODEL_SIZES[point["model"]]
        print(
            f"| {point['model']} ({hidden} x {layers}) | {point['G']} | {point['T']} | "
            f"{args.B * point['G']} | {tokens:.0f} | {step_s['grpo']:.3f} | "
            f"{step_s['grpo_lean']:.3f} | {step_s['grpo_lean'] / step_s['grpo']:.2f} |"
        )


if __name__ == "__main__":
    main()
