"""Sampling settings and the pieces every rollout engine shares: prompts in, completions out.

Follows the chess loop (sampling in eval mode under `no_grad`, the previous mode
restored afterwards; temperature and nucleus sampling) and the usual GRPO
layout: each prompt is repeated G times, groups contiguous (sample
n = i * G + j), prompts left-padded so that every row's new tokens start at
the same column.

Departures and choices:
- Engines sample only what these settings say, never a checkpoint's own
  sampling defaults (`generation_config.json`): a checkpoint shipping
  `repetition_penalty=1.05` or `suppress_tokens` would otherwise sample from
  a policy whose log-probs the loss never sees. The transformers engine
  hides the model's `generation_config` from `generate` for the call; the
  lean engine and vLLM requests never read it.
- A completion ends at the first EOS (kept, it is a sampled action) or at the
  end of the first stop string (its tokens kept, its text kept); anything the
  model emitted after that is dropped from the record.
- Sampling is seeded through a forked RNG, so it is reproducible without
  disturbing the caller's global random state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "GenerationSettings",
    "call_seed",
    "encode_prompt",
    "get_prompt",
    "left_pad",
    "split_completion",
]


@dataclass
class GenerationSettings:
    """How completions are sampled (all fields validated at construction)."""

    max_new_tokens: int = 256
    """Most tokens generated per completion; one that reaches it without EOS is truncated."""
    temperature: float = 1.0
    """Logits are divided by this before sampling, and before scoring log-probs. > 0."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability; (0, 1].
    Below 1 the samples come from a truncated distribution the loss does not score: each token
    is then weighted by p / q (see docs/algorithms.md), which cannot restore the never-sampled
    tail; top_p 1 and top_k 0 keep the update exactly on-policy."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 = no limit (truncation: as for top_p)."""
    stop_strings: tuple[str, ...] = ()
    """A completion also ends after the first occurrence of any of these strings (the tokens
    that complete it kept, as an EOS is; nothing after them is scored or rewarded)."""
    do_sample: bool = True
    """False = greedy decoding (used for evaluation)."""
    generation_batch_size: int | None = None
    """Rows (prompt copies) decoded together; None = all N rows at once."""
    seed: int | None = 0
    """Seeds every sampling call (call k uses a seed mixed from this and k); None = the global
    RNG."""

    def __post_init__(self) -> None:
        self.stop_strings = _as_tuple(self.stop_strings)
        _check_int(self, "max_new_tokens", 1)
        _check_int(self, "top_k", 0)
        if self.generation_batch_size is not None:
            _check_int(self, "generation_batch_size", 1)
        if self.seed is not None:
            _check_int(self, "seed", 0)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ValueError(f"temperature: got {t!r}; allowed: a finite number > 0")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p: got {p!r}; allowed: a number in (0, 1]")
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample: got {self.do_sample!r}; allowed: True or False")

    @property
    def truncates(self) -> bool:
        """True when sampling draws from a truncated distribution (top-k or top-p), which the
        trainer's log-probs (the full tempered softmax) do not score: the loss then weighs
        each token by p/q, the importance weight of the truncated sampler (`CausalLMPolicy`)."""
        return self.do_sample and (self.top_p < 1.0 or self.top_k > 0)

    def replace(self, **changes: Any) -> GenerationSettings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def generation_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `transformers.GenerationConfig` for these settings; every field
        left out keeps transformers' global default, which applies no logits processor (top_k,
        whose global default is 50, is always given when sampling)."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens}
        if self.do_sample:
            kwargs.update(
                do_sample=True,
                temperature=float(self.temperature),
                top_p=float(self.top_p),
                top_k=self.top_k,
            )
        else:  # greedy: sampling warpers do not apply, and transformers rejects them
            kwargs["do_sample"] = False
        return kwargs


def _as_tuple(stop: Any) -> tuple[str, ...]:
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop_strings: got {stop!r}; allowed: non-empty strings")
    return stop


def _check_int(settings: GenerationSettings, name: str, minimum: int) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: got {value!r}; allowed: an integer >= {minimum}")


def call_seed(seed: int, call: int) -> int:
    """The seed of sampling call `call` of a run seeded `seed`: mixed, not `seed + call`, so
    that runs with neighbouring seeds do not share their sampling seeds one call apart."""
    import numpy as np

    return int(np.random.SeedSequence([seed, call]).generate_state(1)[0])


def get_prompt(state: Any, index: int) -> str | list[dict[str, str]]:
    """The prompt of a state: `state["prompt"]`, or the state itself (a str or messages)."""
    prompt = state.get("prompt") if isinstance(state, Mapping) else state
    if isinstance(state, Mapping) and "prompt" not in state:
        raise ValueError(
            f"state {index}: a dict state needs a 'prompt' key; got keys {list(state)}"
        )
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt
    ):
        return [dict(m) for m in prompt]
    raise TypeError(
        f"state {index}: prompt is {type(prompt).__name__}; allowed: a str, or a list of "
        "chat messages {'role': ..., 'content': ...}"
    )


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, str]]) -> list[int]:
    """Token ids fed to the model: the chat template for messages, plain text otherwise."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "prompt is a list of chat messages but the tokenizer has no chat_template; "
            "give plain-text prompts or a tokenizer with a chat template"
        )
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    # the template already wrote any BOS/role tokens; adding special tokens again would double them
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-pad token rows to one width: -> ids (n, L) long, attention_mask (n, L) long."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (n, L)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (n, L)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


def split_completion(
    new_ids: Sequence[int], eos_ids: set[int], stop_strings: tuple[str, ...], tokenizer: Any
) -> tuple[list[int], bool, bool]:
    """Cut generated ids at the first EOS or stop string -> (ids, finished_by_eos, stopped)."""
    new_ids = [int(t) for t in new_ids]
    end = next((k for k, t in enumerate(new_ids) if t in eos_ids), None)
    stop_end = _stop_string_end(
        new_ids[: len(new_ids) if end is None else end], stop_strings, tokenizer
    )
    if stop_end is not None:
        return new_ids[:stop_end], False, True
    if end is not None:
        return new_ids[: end + 1], True, False
    return new_ids, False, False


def _stop_string_end(ids: list[int], stop_strings: tuple[str, ...], tokenizer: Any) -> int | None:
    """Smallest k such that the text of ids[:k] contains a stop string, else None."""
    if not stop_strings or not any(s in tokenizer.decode(ids) for s in stop_strings):
        return None
    for k in range(1, len(ids) + 1):  # only reached when a stop string is present
        text = tokenizer.decode(ids[:k])
        if any(s in text for s in stop_strings):
            return k
    return None  # pragma: no cover - the full text contained a stop string
