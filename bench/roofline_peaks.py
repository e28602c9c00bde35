"""This machine's peaks, measured in-process: matrix-product rate per dtype and memory bandwidth.

`bench/roofline.py` measures them in the process that runs the steps, at the run's thread
count, so that a phase is compared with what this machine does under the same settings: a
GEMM of the model's MLP shape, (rows, H) @ (H, I), in each dtype a phase multiplies in (always
float32 and bfloat16), and a copy and a sum of a large float32 tensor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["bandwidth", "best_peaks", "gemm_rate", "measure_peaks"]


def gemm_rate(dtype: str, m: int, k: int, n: int, repeats: int) -> dict[str, Any]:
    """FLOP/s of (m, k) @ (k, n) in `dtype` at torch's current thread count: 2mkn over the
    best of `repeats` timed products, after one untimed (kernel choice, allocation)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(getattr(torch, dtype))  # (m, k)
    b = torch.randn(k, n, generator=generator).to(getattr(torch, dtype))  # (k, n)
    out = a @ b  # (m, n)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = a @ b
        best = min(best, time.perf_counter() - start)
    return {"flops_per_s": 2 * m * k * n / best, "shape": [m, k, n],
            "computed_dtype": str(out.dtype).removeprefix("torch.")}  # fmt: skip


def bandwidth(mib: int, repeats: int) -> dict[str, float]:
    """Bytes/s of a copy (read + write) and of a sum (read) of a float32 tensor of `mib` MiB,
    best of `repeats` each; `bytes_per_s` is the faster."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()

    def best(work: Callable[[], Any]) -> float:
        work()  # pages touched, threads woken
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return min(times)

    copy = 2 * nbytes / best(lambda: dst.copy_(src))
    total = nbytes / best(src.sum)
    return {"copy_bytes_per_s": copy, "sum_bytes_per_s": total, "bytes_per_s": max(copy, total),
            "mib": mib}  # fmt: skip


def measure_peaks(dtypes: Sequence[str], shape: tuple[int, int, int], mib: int,
                  repeats: int) -> dict[str, Any]:  # fmt: skip
    """The rate of an (m, k) @ (k, n) product in each of `dtypes` (`shape` = (m, k, n)), and
    the memory bandwidth, at torch's current thread count."""
    matmul = {d: gemm_rate(d, *shape, repeats) for d in dtypes}
    return {"threads": torch.get_num_threads(), "matmul": matmul,
            "memory": bandwidth(mib, repeats)}  # fmt: skip


def best_peaks(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several `measure_peaks` of one run -> the fastest each showed: per dtype the fastest
    product, the fastest memory, and every sample's product rate (`matmul_rates`, FLOP/s in
    order). A limit is the least time the work could take, so it is set by the fastest the
    machine ran; a shared virtual machine's rate moves within a run, and the rates show by
    how much."""
    if not samples:
        raise ValueError("best_peaks: got no samples; measure the peaks at least once")
    dtypes = samples[0]["matmul"]
    return {"threads": samples[0]["threads"], "samples": len(samples),
            "matmul": {d: max((s["matmul"][d] for s in samples), key=lambda p: p["flops_per_s"])
                       for d in dtypes},
            "matmul_rates": {d: [s["matmul"][d]["flops_per_s"] for s in samples] for d in dtypes},
            "memory": max((s["memory"] for s in samples), key=lambda m: m["bytes_per_s"])}  # fmt: skip
