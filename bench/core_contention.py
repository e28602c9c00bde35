"""Do two workers on this machine's cores slow each other? bfloat16 matrix products, one torch
thread each: one worker alone on each core, then two side by side, as two processes (one per
core) and as two threads of one process (as the overlapped run's sampler and trainer are).

    python bench/core_contention.py            # GFLOP/s of each worker, in each layout

If the side-by-side figures match the alone ones, the cores do not slow each other's
arithmetic; the (1024, 1024) matrices stay in the cache, so the memory bus is not tested
(docs/async.md).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import torch


def gflops(seconds: float = 6.0, n: int = 1024) -> float:
    """Matrix products of (n, n) bfloat16 matrices for `seconds`, one torch thread: GFLOP/s."""
    torch.set_num_threads(1)
    a = torch.randn(n, n, dtype=torch.bfloat16)
    b = torch.randn(n, n, dtype=torch.bfloat16)
    for _ in range(5):  # warm-up
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e9


def _processes(cores: list[int]) -> list[float]:
    """One worker process per core (taskset), all at once."""
    command = [sys.executable, __file__, "--one"]
    runs = [
        subprocess.Popen(["taskset", "-c", str(c), *command], stdout=subprocess.PIPE, text=True)
        for c in cores
    ]
    return [float(run.communicate()[0]) for run in runs]


def _threads(count: int) -> list[float]:
    """`count` worker threads of this process, all at once."""
    results: list[float] = []
    workers = [threading.Thread(target=lambda: results.append(gflops())) for _ in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def main() -> None:
    if sys.argv[1:] == ["--one"]:
        print(gflops())
        return
    alone = [_processes([core])[0] for core in (0, 1)]
    print(f"alone, core 0 then core 1: {alone[0]:.1f} {alone[1]:.1f} GFLOP/s")
    print("two processes side by side: " + " ".join(f"{x:.1f}" for x in _processes([0, 1])))
    print("two threads side by side:   " + " ".join(f"{x:.1f}" for x in _threads(2)))


if __name__ == "__main__":
    main()
