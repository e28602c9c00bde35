"""Peak memory of the completion log-prob loss for a large vocabulary (forward and backward).

    python bench/large_vocab_memory.py                  # N=8, T=1024, V=151936, H=256
    python bench/large_vocab_memory.py -N 2 -T 64 -V 5000

Each method runs in a fresh subprocess: hidden states (N, T, H) and an output
weight (V, H) are created, the process's resident memory is read, then the
loss sum(log p(token)) is computed and backpropagated to both. Reported: the
peak resident memory above that baseline (Linux `ru_maxrss`), and the seconds.

- logits + selective_log_softmax: logits = hidden @ weight.T materialised
  (what the model's forward returns), then the chunked log-softmax;
- output_layer_logprobs: the output layer folded into the chunked
  log-softmax; no (N, T, V) tensor exists.
H only sets the matmul cost; the logits' size, N x T x V, does not depend on it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

METHODS = ("logits", "output_layer")


def measure(method: str, N: int, T: int, V: int, H: int) -> dict:
    import resource

    import psutil
    import torch

    from grpo.functional.logprobs import selective_log_softmax
    from grpo.functional.output_layer import output_layer_logprobs

    torch.manual_seed(0)
    hidden = torch.randn(N, T, H, requires_grad=True)  # (N, T, H)
    weight = (torch.randn(V, H) / H**0.5).requires_grad_(True)  # (V, H)
    index = torch.randint(0, V, (N, T))  # (N, T)
    baseline = psutil.Process().memory_info().rss
    start = time.perf_counter()
    if method == "logits":
        logprobs = selective_log_softmax(hidden @ weight.T, index)  # (N, T, V) logits live here
    else:
        logprobs = output_layer_logprobs(hidden, weight, index)
    logprobs.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "method": method,
        "shape": [N, T, V, H],
        "loss_peak_mib": (peak - baseline) / 2**20,
        "logits_fp32_mib": N * T * V * 4 / 2**20,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-N", type=int, default=8)
    parser.add_argument("-T", type=int, default=1024)
    parser.add_argument("-V", type=int, default=151936)
    parser.add_argument("-H", type=int, default=256)
    parser.add_argument("--method", choices=METHODS, help="run one method in this process")
    args = parser.parse_args()
    if args.method:
        print(json.dumps(measure(args.method, args.N, args.T, args.V, args.H)))
        return
    shape = ["-N", str(args.N), "-T", str(args.T), "-V", str(args.V), "-H", str(args.H)]
    rows = []
    for method in METHODS:
        command = [sys.executable, __file__, *shape, "--method", method]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("| method | N x T x V | peak above inputs, MiB | fp32 logits would be, MiB | s |")
    print("|---|---|---|---|---|")
    for r in rows:
        N, T, V, _ = r["shape"]
        print(
            f"| {r['method']} | {N} x {T} x {V} | {r['loss_peak_mib']:.0f} | "
            f"{r['logits_fp32_mib']:.0f} | {r['seconds']:.1f} |"
        )


if __name__ == "__main__":
    main()
