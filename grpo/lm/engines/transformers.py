"""The default rollout engine: the trainer's own model samples with transformers' `generate`.

Follows the chess loop (sampling in eval mode under `no_grad`, the previous mode
restored afterwards). Every call samples from a fresh `GenerationConfig` built
from `GenerationSettings` alone: `generate` fills every field a config leaves
unset from `model.generation_config` (a checkpoint's `generation_config.json`:
`suppress_tokens`, `min_p`, `sequence_bias`, ...), so for the call the model's
own `generation_config` *is* that fresh config, and the merge has nothing to
add whatever the checkpoint ships. Sampling is seeded through a forked RNG (`sample_in_chunks`), so it is
reproducible without disturbing the caller's global random state.

The engine computes in its own `precision` (`grpo.precision`: bf16-mixed runs
`generate` under bfloat16 autocast). When that is not the scorer's, the
sampler is no longer the scorer (`samples_with_scorer` False) and the engine
returns the log-prob it gave each sampled token, for the policy's gap metrics
and importance weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from grpo.functional.sampling import sampled_logprobs
from grpo.lm.engines.base import Samples, sample_in_chunks
from grpo.lm.sampling import GenerationSettings
from grpo.precision import compute_precision

__all__ = ["TransformersEngine", "sample_token_ids"]


class TransformersEngine:
    """Samples with the trainer's model itself (`transformers` `generate`).

    Subclasses that also sample with the trainer's model change `_samples` only.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        precision: str = "fp32",
        scorer_precision: str = "fp32",
        tis_cap: float | None = None,
    ) -> None:
        """`precision`: what sampling computes in; `scorer_precision`: what the loss scores
        in; `tis_cap`: the importance-weight cap when they differ (None = no weights)."""
        self.model = model
        self.tokenizer = tokenizer
        self.precision = precision
        self.samples_with_scorer = precision == scorer_precision
        self.tis_cap = None if self.samples_with_scorer else tis_cap
        self.metrics: dict[str, float] = {}  # nothing to report beyond the policy's own

    def sample(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        was_training = self.model.training
        self.model.eval()  # the chess loop: no dropout noise in the behaviour policy
        device_type = next(self.model.parameters()).device.type
        try:
            with torch.no_grad(), compute_precision(self.context_precision(), device_type):
                return self._samples(prompt_rows, settings, eos_ids, seed)
        finally:
            self.model.train(was_training)

    def _samples(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        """New ids per row (eval mode, no_grad), with their sampler log-probs when they are
        not the scorer's (`reports_logprobs`)."""
        return sample_token_ids(
            self.model, self.tokenizer, prompt_rows, settings, eos_ids, seed,
            self.reports_logprobs(settings),
        )  # fmt: skip

    def context_precision(self) -> str:
        """The precision `sample` runs under: its own (the model it holds is bf16-copy's
        copy when that is its precision)."""
        return self.precision

    def reports_logprobs(self, settings: GenerationSettings) -> bool:
        """True when the sampled distribution is not the scorer's: truncated (top-k, top-p),
        or computed in another precision."""
        return settings.truncates or not self.samples_with_scorer


def sample_token_ids(
    model: Any,
    tokenizer: Any,
    prompt_rows: Sequence[Sequence[int]],
    settings: GenerationSettings,
    eos_ids: list[int],
    seed: int | None,
    logprobs: bool | None = None,
) -> Samples:
    """Generate new tokens for each prompt row (rows already repeated G times) -> (n, <= T);
    with `logprobs` (None: with top-k/top-p) also log q of each token under the distribution
    it came from (`_SampledLogprobs`: one step's scores kept at a time, never (n, T, V))."""
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=list(eos_ids),
        **settings.generation_config_kwargs(),
    )

    truncated = settings.truncates if logprobs is None else logprobs

    def decode(ids: Tensor, mask: Tensor) -> Samples:
        stop = StoppingCriteriaList()
        if settings.stop_strings:
            stop.append(_StopStrings(settings.stop_strings, tokenizer, ids.shape[1]))
        record = _SampledLogprobs(settings) if truncated else None
        with _model_defaults(model, config):
            sequences = model.generate(
                input_ids=ids, attention_mask=mask, generation_config=config,
                stopping_criteria=stop,
                logits_processor=LogitsProcessorList([record] if record else []),
            )  # fmt: skip
        new = sequences[:, ids.shape[1] :]  # (n, <= max_new_tokens)
        if record is None:
            return Samples(new.tolist(), None)
        return Samples(new.tolist(), record.finish(new[:, -1]).T.tolist())  # (n, t)

    device = next(model.parameters()).device
    return sample_in_chunks(prompt_rows, settings, seed, tokenizer.pad_token_id, device, decode)


@contextlib.contextmanager
def _model_defaults(model: Any, config: Any) -> Iterator[None]:
    """`config` as the model's own `generation_config` inside, the model's back after.

    `generate` merges `model.generation_config` into the config it is given (the fields
    left None); with the given config in its place the merge adds nothing. A PEFT model
    generates with its base model, whose config is the one read.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    previous = base.generation_config
    base.generation_config = config
    try:
        yield
    finally:
        base.generation_config = previous


class _SampledLogprobs:
    """A logits processor that records log q of each sampled token, one step at a time.

    `generate` runs processors passed to it before its own temperature, top-k and
    top-p warpers and draws the token after them, so each call keeps this step's
    scores and, on the next call, reads the token drawn from them (the last one is
    read by `finish`). q is `grpo.functional.sampling.sampled_logprobs`: the same
    warpers in the same order as `generate`'s. Only one step's (n, V) scores are held,
    where `generate`'s `output_scores` would stack all of them into (n, T, V).
    """

    def __init__(self, settings: GenerationSettings) -> None:
        self.settings = settings
        self.pending: Tensor | None = None  # (n, V) the scores of the step whose token is unread
        self.logq: list[Tensor] = []  # (n,) per step

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.pending is not None:
            self._read(input_ids[:, -1])  # the token drawn from the previous step's scores
        self.pending = scores
        return scores  # unchanged: sampling is exactly as without this processor

    def finish(self, last_tokens: Tensor) -> Tensor:
        """Read the last step's token (n,) -> log q of every step (t, n)."""
        self._read(last_tokens)
        return torch.stack(self.logq)  # (t, n)

    def _read(self, tokens: Tensor) -> None:
        s = self.settings
        self.logq.append(sampled_logprobs(self.pending, tokens, s.temperature, s.top_k, s.top_p))
        self.pending = None


class _StopStrings:
    """Stopping criterion: a row is done once its new text contains a stop string.

    Decoding the new tokens works with any tokenizer, where matching strings
    against the vocabulary (transformers' `stop_strings`) needs one it can parse.
    """

    def __init__(self, stop_strings: tuple[str, ...], tokenizer: Any, prompt_width: int) -> None:
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: Any) -> Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width :])
        done = [any(s in text for s in self.stop_strings) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # (n,)
