"""The default rollout engine: the trainer's own model samples with transformers' `generate`.

Follows seed 001 (sampling in eval mode under `no_grad`, the previous mode
restored afterwards). Every sampling knob that would change the distribution
is set explicitly (`GenerationSettings.generation_config_kwargs`), because
`generate` fills unset fields from the model's own `generation_config`.
Sampling is seeded through a forked RNG (`sample_in_chunks`), so it is
reproducible without disturbing the caller's global random state.

The engine computes in its own `precision` (`grpo.precision`: bf16-mixed runs
`generate` under bfloat16 autocast). When that is not the scorer's, the
sampler is no longer the scorer (`samples_with_scorer` False) and the engine
returns the log-prob it gave each sampled token, for the policy's gap metrics
and importance weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

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
        self.model.eval()  # seed 001: no dropout noise in the behaviour policy
        device_type = next(self.model.parameters()).device.type
        try:
            with torch.no_grad(), compute_precision(self.precision, device_type):
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
    it came from (`generate`'s processed scores: temperature, top-k, top-p applied)."""
    from transformers import GenerationConfig, StoppingCriteriaList

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
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, stopping_criteria=stop,
            output_scores=truncated, return_dict_in_generate=True,
        )  # fmt: skip
        new = out.sequences[:, ids.shape[1] :]  # (n, <= max_new_tokens)
        if not truncated:
            return Samples(new.tolist(), None)
        scores = torch.stack(out.scores, 1).float()  # (n, t, V) processed: -inf outside the set
        logq = scores.log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)  # (n, t)
        return Samples(new.tolist(), logq.tolist())

    device = next(model.parameters()).device
    return sample_in_chunks(prompt_rows, settings, seed, tokenizer.pad_token_id, device, decode)


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
