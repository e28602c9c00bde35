"""vLLM requests for `GenerationSettings`, and vLLM's outputs back as `Samples`.

Plain mapping, no engine: `vllm` itself is imported by the caller, so this runs
(and is tested) where vLLM is not installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpo.lm.engines.base import Samples
from grpo.lm.sampling import GenerationSettings

__all__ = ["check_room", "parse_outputs", "request_seeds", "sampling_params_kwargs"]


def check_room(
    prompt_rows: Sequence[Sequence[int]], max_new_tokens: int, limit: int | None, whose: str
) -> None:
    """Refuse a rollout whose longest prompt plus `max_new_tokens` exceeds `limit` (None: no
    limit): vLLM would stop such a completion at the limit without marking it cut short, and
    it would be rewarded and trained on as if complete."""
    longest = max((len(row) for row in prompt_rows), default=0)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds {whose} "
            f"({limit})"
        )


def sampling_params_kwargs(
    settings: GenerationSettings, eos_ids: Sequence[int], seed: int | None
) -> dict[str, Any]:
    """`vllm.SamplingParams` arguments that sample as `GenerationSettings` means."""
    sampling = (
        {"temperature": float(settings.temperature), "top_p": float(settings.top_p)}
        if settings.do_sample
        else {"temperature": 0.0, "top_p": 1.0}  # greedy
    )
    return {
        **sampling,
        "top_k": settings.top_k if settings.do_sample else 0,  # 0 = no limit, in both
        "max_tokens": settings.max_new_tokens,
        "stop": list(settings.stop_strings),
        "stop_token_ids": list(eos_ids),  # every EOS ends a completion, as with generate
        "n": 1,
        "logprobs": 0,  # the sampled token's log-prob only
        "seed": seed,
        # every other processor off, explicitly (the engine loads no generation_config.json)
        "min_p": 0.0,
        "min_tokens": 0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        # stop strings are matched on text with special tokens, like `tokenizer.decode`
        "skip_special_tokens": False,
        "detokenize": bool(settings.stop_strings),
    }


def request_seeds(seed: int | None, n: int) -> list[int | None]:
    """One seed per request, distinct across rows and calls; None = vLLM's own RNG."""
    if seed is None:
        return [None] * n
    return [(seed * 1_000_003 + i) % (2**63 - 1) for i in range(n)]


def parse_outputs(outputs: Sequence[Any]) -> Samples:
    """vLLM `RequestOutput`s (one sample each) -> token ids and their log-probs per row."""
    token_ids, logprobs = [], []
    for i, output in enumerate(outputs):
        sample = output.outputs[0]
        ids = [int(t) for t in sample.token_ids]
        entries = sample.logprobs  # one {token id: Logprob} per generated position
        if entries is None or len(entries) != len(ids):
            raise RuntimeError(f"vLLM returned no log-prob for some sampled tokens of row {i}")
        token_ids.append(ids)
        logprobs.append([float(entry[t].logprob) for entry, t in zip(entries, ids, strict=True)])
    return Samples(token_ids, logprobs)
