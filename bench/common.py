"""What every benchmark in `bench/` shares: the model sizes, the workload, the reward.

One `Workload` fixes everything both trainers are given: model size, B prompts,
G completions each, T new tokens at most, β, learning rate, steps. The model
is a random-init Qwen2 built locally (a byte-level BPE tokenizer trained here
with `tokenizers`, nothing downloaded) and saved once to a folder, so every
process loads the very same weights with `from_pretrained`.
"""

from __future__ import annotations

import dataclasses
import os
import random
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import WORDS, build_tokenizer, random_words  # noqa: E402

__all__ = [
    "MODEL_SIZES",
    "Workload",
    "build_model",
    "busy_threads",
    "load_average",
    "peak_rss_mib",
    "prompts",
    "settled_load",
    "timing_flags",
    "worker_env",
    "yes_reward",
]

MODEL_SIZES = {  # name -> (hidden, intermediate, layers, attention heads, key-value heads)
    "tiny": (32, 64, 2, 4, 2),
    "small": (128, 384, 4, 4, 2),
    "medium": (256, 768, 6, 8, 4),
    "large": (512, 1536, 8, 8, 4),
}


@dataclass(frozen=True)
class Workload:
    """One configuration, given identically to every trainer that is compared."""

    model: str = "small"  # a key of MODEL_SIZES
    prompts: int = 4  # B
    group_size: int = 4  # G
    max_new_tokens: int = 32  # T: completion tokens at most
    beta: float = 0.0  # KL coefficient (0: no reference model)
    learning_rate: float = 1e-5
    steps: int = 4  # timed optimizer steps, after one warm-up step
    threads: int = 2  # torch intra-op threads
    precision: str = "fp32"  # or "bf16-mixed": grpo's policy.precision, TRL's bf16=True

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def build_model(path: str | Path, size: str, seed: int = 0) -> Path:
    """Save a random-init Qwen2 of `size` and the test tokenizer to `path` (once)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = Path(path)
    if (path / "config.json").is_file():
        return path
    hidden, inter, layers, heads, kv_heads = MODEL_SIZES[size]
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def prompts(n: int, seed: int = 0) -> list[str]:
    """n plain-text prompts of 4 to 8 words."""
    rng = random.Random(seed)
    return [random_words(rng, 4, 8, WORDS) for _ in range(n)]


def yes_reward(prompts, completions, **kwargs) -> list[float]:
    """Fraction of the completion's words that are "yes" (the same callable for both trainers)."""
    out = []
    for completion in completions:
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        words = text.split()
        out.append(sum(w == "yes" for w in words) / max(len(words), 1))
    return out


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_average() -> float:
    """The machine's 1-minute load average (runnable processes), read just before a run."""
    return os.getloadavg()[0]


def settled_load(
    limit_s: float = 180.0,
    cores: int | None = None,
    read: Callable[[], float] = load_average,
    sleep: Callable[[float], None] = time.sleep,
    every_s: float = 5.0,
) -> float:
    """The 1-minute load average once it is at most half the cores, waiting up to `limit_s`
    for it: the average decays over about a minute, so a run started straight after heavy work
    of the same queue (another seed's evaluations) would read that work as a busy machine. A
    load that does not settle is returned as read at the end, for `timing_flags` to flag."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    load, waited = read(), 0.0
    while load > cores / 2 and waited < limit_s:
        sleep(every_s)
        waited += every_s
        load = read()
    return load


def worker_env() -> dict[str, str]:
    """The environment of a measured run's process: this one's, with OpenMP threads that sleep
    rather than spin while they wait (`OMP_WAIT_POLICY=PASSIVE` unless it is set). On a machine
    shared with other work, two spinning threads of a small model's step were measured to make
    it several times slower; alone, waiting costs little either way."""
    return {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


def busy_threads(threads: int, env: dict[str, str]) -> int:
    """How many of a run's `threads` its CPU time should show busy all along: every one when
    OpenMP's waiting threads spin (its default), one when they sleep (`OMP_WAIT_POLICY=PASSIVE`,
    `worker_env`): the serial parts of a small model's step then leave the others idle, and
    `timing_flags` asks only that the main thread was not starved."""
    return 1 if env.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" else threads


def timing_flags(
    load_before: float, cpu_s: float, wall_s: float, threads: int, cores: int | None = None
) -> list[str]:
    """Why a run's timing is suspect, [] when it is not: the machine was busy before it
    (load average above half the cores), or the run got less CPU than its threads ask for
    (CPU time under 0.8 x wall x threads: something else had the cores)."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    flags = []
    if load_before > cores / 2:
        flags.append(f"load {load_before:.1f} > {cores / 2:g}")
    if wall_s > 0 and cpu_s < 0.8 * wall_s * threads:
        flags.append(f"CPU {cpu_s / (wall_s * threads):.2f} x wall x {threads} threads")
    return flags
