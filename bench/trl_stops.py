"""Stop strings for TRL 1.16's `GRPOTrainer`, which has no setting for them.

A base model asked in grpo's plain form ("Question: ...\\nAnswer:") ends its
answer where it starts the next question (`grpo.lm.prompt_forms.PLAIN_STOP`).
grpo stops sampling a row there and cuts its completion after the stop string
(`grpo.lm.sampling.split_completion`: the tokens that complete it kept, as an
EOS is; anything after them dropped), so the reward sees the text up to and
including the stop string and the loss counts those tokens. TRL 1.16 ends a
completion only at an EOS. Three pieces give it the same ends:

- `generation_kwargs`: `stop_strings` for `GRPOConfig.generation_kwargs`,
  which TRL writes into the `GenerationConfig` of its `generate` calls;
- transformers' `generate` matches stop strings only with the tokenizer passed
  to it, and TRL passes none (it would raise): `stop_at_strings` hands it over;
- a row that stopped is padded to the batch's longest (Gemma's pad is not its
  EOS), and TRL's completion mask ends only at the first EOS, so the pads after
  a stop string would be scored and counted in the loss: `stop_at_strings` cuts
  each completion TRL samples with `split_completion`, grpo's own cut.

Without stop strings nothing is changed: TRL's completions already end at their
first EOS, where `split_completion` would cut them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["generation_kwargs", "stop_at_strings"]


def generation_kwargs(stop_strings: Sequence[str]) -> dict[str, Any] | None:
    """`GRPOConfig.generation_kwargs` that end generation at `stop_strings` (None: none)."""
    return {"stop_strings": list(stop_strings)} if stop_strings else None


def stop_at_strings(trainer: Any, stop_strings: Sequence[str]) -> None:
    """Make `trainer` (a TRL GRPOTrainer built with `generation_kwargs(stop_strings)`) stop
    each completion at the first of `stop_strings` and cut it there exactly as grpo does."""
    if not stop_strings:
        return
    from grpo.lm.sampling import split_completion

    tokenizer, model = trainer.processing_class, trainer.model
    stops, eos_ids = tuple(stop_strings), set(trainer.eos_token_ids)
    generate, sample = model.generate, trainer._generate_single_turn

    def generate_with_tokenizer(*args: Any, **kwargs: Any) -> Any:
        return generate(*args, tokenizer=tokenizer, **kwargs)

    def sample_cut(*args: Any, **kwargs: Any) -> tuple[list[list[int]], Any]:
        completion_ids, logprobs = sample(*args, **kwargs)
        cut = [split_completion(ids, eos_ids, stops, tokenizer)[0] for ids in completion_ids]
        if logprobs is not None:  # a sampler's own log-probs (vLLM), one per kept token
            logprobs = [lps[: len(ids)] for lps, ids in zip(logprobs, cut, strict=True)]
        return cut, logprobs

    model.generate = generate_with_tokenizer  # the object TRL calls `generate` on
    trainer._generate_single_turn = sample_cut
