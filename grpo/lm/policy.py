"""`CausalLMPolicy`: a transformers causal LM as a GRPO policy (the framework API's `PolicyModel`).

States are prompt records (a dict with "prompt" plus any dataset columns, or a
bare prompt: a str, or a list of chat messages); actions are `Completion`
records holding the sampled token ids, so scoring never re-tokenises text.
Sampling (the chess loop: eval mode, no_grad, G contiguous copies of each prompt)
is in `sampling.py`; scoring (the chess loop and picoRL: one forward, causal shift,
sampling temperature, EOS mask) in `scoring.py`.

Choices:
- Dropout is switched off by default (`disable_dropout`): with dropout, the
  same tokens get different log-probs on every pass, and the importance
  ratio π/π_old is noise even before any update.
- The reference policy (`make_reference`) is a frozen deep copy, or, for a
  PEFT model, a view running the same model with its adapters disabled; it
  keeps the policy's weights dtype and scores in its `precision`.
- `precision` bf16-mixed computes the forward and backward under bfloat16
  autocast while weights, gradients and optimizer state stay float32
  (`grpo.precision`); bf16-copy computes them on a bfloat16 copy of the model
  (`compute_model()`, `grpo.lm.compute_copy`), whose gradients land on the
  float32 weights; sampling computes in `rollout.precision`, by default the
  same (the transformers engine samples from the same copy).
- Sampling goes through a rollout engine (`grpo.lm.engines`): the model's own
  `generate` by default, a lean decoding loop, or vLLM computing with the same
  weights; the sampled ids are cut into completions here, so masks do not
  depend on the engine.
- Samples not drawn from the distribution the loss scores (the full tempered
  softmax p) carry the sampler's log-probs: vLLM's, another precision's, or
  top-k / top-p's truncated q = p / Z. The gap to log π_old is a rollout
  metric, and the loss weighs each token by π_old / π_sampler, capped at
  `rollout.tis_cap` (at 1 for truncation, where the weight is the kept mass
  Z <= 1): the update is the one for samples of p. The cap of 1 holds only
  while π_old and the sampler are the same weights: a batch sampled with older
  weights (overlapped rollouts) hands its recorded log-probs to the loss as
  `Rollout.sampler_logprobs` (`sampler_logprobs`), weighed there against the
  trainer's π_old and truncated at `rollout.tis_cap` (`grpo.step.objective`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from grpo.lm.completion import Completion
from grpo.lm.compute_copy import ComputeCopy
from grpo.lm.engines import RolloutSettings, make_rollout_engine
from grpo.lm.engines.mismatch import engine_logprobs, gap_metrics, importance_weights
from grpo.lm.loading import (
    LoraSettings,
    apply_lora,
    ensure_pad_token,
    freeze_parameters,
    is_peft_model,
    load_model_and_tokenizer,
    save_model,
    source_licence,
)
from grpo.lm.model_setup import context_length, disable_dropout, enable_checkpointing, eos_ids
from grpo.lm.reference import AdapterDisabledReference
from grpo.lm.sampling import (
    GenerationSettings,
    call_seed,
    encode_prompt,
    get_prompt,
    split_completion,
)
from grpo.lm.scoring import ScoringSettings, score_completions
from grpo.lm.settings import CausalLMSettings
from grpo.precision import COPIED, PRECISIONS, resolve_precision
from grpo.protocols import TokenLogProbs

__all__ = ["CausalLMPolicy", "CausalLMSettings", "disable_dropout"]


class CausalLMPolicy:
    """Samples `Completion`s from a causal LM and scores their tokens (PolicyModel + TokenLevelPolicy)."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        settings: CausalLMSettings | None = None,
        rollout: RolloutSettings | None = None,
    ) -> None:
        """`rollout` chooses the sampling engine; None = the model's own `generate`."""
        self.model = model
        self.tokenizer = tokenizer
        self.settings = CausalLMSettings() if settings is None else settings
        ensure_pad_token(tokenizer)
        self.eos_token_ids = eos_ids(model, tokenizer)
        self.context_length = context_length(model)
        self.rollout_metrics: dict[str, float] = {}  # the last sampling and no-grad scoring
        self.licence = source_licence(model)  # passed on to every folder saved from this policy
        self._sampling_calls = 0
        if self.settings.disable_dropout:
            disable_dropout(model)
        if self.settings.gradient_checkpointing:
            enable_checkpointing(model)
            if is_peft_model(model):
                model.enable_input_require_grads()
        self.rollout = RolloutSettings() if rollout is None else rollout
        if not isinstance(self.rollout, RolloutSettings):
            got = type(rollout).__name__
            raise TypeError(f"rollout: got {got}; allowed: RolloutSettings or None")
        # auto resolved for the model's device, written back: the run's config.yaml records it
        device, s, r = next(model.parameters()).device, self.settings, self.rollout
        s.precision = resolve_precision("policy.precision", s.precision, device)
        if r.precision is not None:
            r.precision = resolve_precision("rollout.precision", r.precision, device)
        # bf16-copy's bfloat16 copy (grpo.lm.compute_copy): the scorer's, and the sampler's
        # where the transformers engine samples in it (the lean engine casts its own)
        sampled = r.precision or s.precision
        copy_samples = r.engine == "transformers" and sampled in COPIED
        cast = s.precision if s.precision in COPIED else sampled if copy_samples else None
        self.compute_copy = None if cast is None else ComputeCopy(model, PRECISIONS[cast])
        sampler = self.compute_copy.model if copy_samples else model
        self.rollout_engine = make_rollout_engine(r, sampler, tokenizer, s.precision)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        settings: CausalLMSettings | None = None,
        *,
        lora: LoraSettings | None = None,
        dtype: str = "auto",
        device: str | torch.device | None = None,
        rollout: RolloutSettings | None = None,
        freeze: tuple[str, ...] = (),
    ) -> CausalLMPolicy:
        """Load model and tokenizer from a folder (or hub id), optionally wrapped with LoRA;
        the parameters matching a `freeze` pattern stay as loaded (`freeze_parameters`)."""
        model, tokenizer = load_model_and_tokenizer(path, dtype=dtype, device=device)
        if freeze:
            freeze_parameters(model, tuple(freeze), "model.freeze")
        if lora is not None:
            model = apply_lora(model, lora)
        return cls(model, tokenizer, settings, rollout)

    @property
    def training(self) -> bool:
        return self.model.training

    def train(self) -> CausalLMPolicy:
        self.model.train()
        return self

    def eval(self) -> CausalLMPolicy:
        self.model.eval()
        return self

    def to(self, device: Any) -> CausalLMPolicy:
        self.model.to(device)
        if self.compute_copy is not None:  # bf16-copy's copy goes with it
            self.compute_copy.model.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def get_parameters(self) -> dict[str, Tensor]:
        """Trainable parameters only (the LoRA adapters, for a PEFT model)."""
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def state_dict(self) -> dict[str, Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> Any:
        return self.model.load_state_dict(state)

    def compute_model(self) -> nn.Module:
        """The network a forward computes with: under bf16-copy its bfloat16 copy, re-cast
        first if the weights changed (`ComputeCopy.current`), else the model itself."""
        return self.model if self.compute_copy is None else self.compute_copy.current()

    def sampling_state(self) -> dict[str, int]:
        """Where the sampling seeds have got to (for resuming a run bitwise)."""
        return {"sampling_calls": self._sampling_calls}

    def load_sampling_state(self, state: dict[str, int]) -> None:
        self._sampling_calls = int(state["sampling_calls"])

    def encode_states(self, states: Sequence[Any]) -> list[list[int]]:
        """Prompt token ids of each state; raises if a prompt leaves no room to generate."""
        max_new = self.settings.generation.max_new_tokens
        rows = []
        for i, state in enumerate(states):
            ids = encode_prompt(self.tokenizer, get_prompt(state, i))
            if not ids:
                raise ValueError(f"state {i}: the prompt encodes to no tokens")
            if self.context_length is not None and len(ids) + max_new > self.context_length:
                raise ValueError(
                    f"state {i}: prompt of {len(ids)} tokens + max_new_tokens={max_new} exceeds "
                    f"the model's context of {self.context_length} tokens; shorten the prompt "
                    "or lower max_new_tokens"
                )
            rows.append(ids)
        return rows

    def generate_actions(
        self, states: Sequence[Any], num_actions_per_state: int, **overrides: Any
    ) -> list[list[Completion]]:
        """Sample G completions per state -> B groups of G, sample n = i * G + j.

        `overrides` replace `GenerationSettings` fields for this call only
        (e.g. `do_sample=False` for greedy evaluation).
        """
        G = num_actions_per_state
        if isinstance(G, bool) or not isinstance(G, int) or G < 1:
            raise ValueError(f"num_actions_per_state: got {G!r}; allowed: an integer >= 1")
        settings = (
            self.settings.generation.replace(**overrides) if overrides else self.settings.generation
        )
        prompt_rows = self.encode_states(states)
        rows = [ids for ids in prompt_rows for _ in range(G)]  # (N,) groups contiguous
        seed = None if settings.seed is None else call_seed(settings.seed, self._sampling_calls)
        self._sampling_calls += 1
        if self.compute_copy is not None:
            self.compute_copy.current()  # re-cast before the engine samples from it
        samples = self.rollout_engine.sample(rows, settings, self.eos_token_ids, seed)
        engine_logprobs = samples.logprobs or [None] * len(rows)
        completions = [
            self._completion(p, ids, settings, lps)
            for p, ids, lps in zip(rows, samples.token_ids, engine_logprobs, strict=True)
        ]
        self.rollout_metrics = {
            **_generation_metrics(completions),
            **self.rollout_engine.metrics,
        }
        return [completions[i * G : (i + 1) * G] for i in range(len(states))]

    def _completion(
        self,
        prompt_ids: list[int],
        new_ids: list[int],
        settings: GenerationSettings,
        engine_logprobs: list[float] | None = None,
    ) -> Completion:
        ids, by_eos, stopped = split_completion(
            new_ids, set(self.eos_token_ids), settings.stop_strings, self.tokenizer
        )
        return Completion(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            completion_ids=ids,
            prompt_ids=prompt_ids,
            truncated=not (by_eos or stopped) and len(ids) >= settings.max_new_tokens,
            finished_by_eos=by_eos,
            engine_logprobs=None if engine_logprobs is None else engine_logprobs[: len(ids)],
        )

    def get_log_probabilities(self, states: Sequence[Any], actions: Sequence[Completion]) -> Tensor:
        """Sum of the counted tokens' log-probs per completion -> (N,)."""
        out = self.get_token_log_probabilities(states, actions)
        return out.logprobs.sum(-1)  # (N,) masked positions are exactly 0

    def get_token_log_probabilities(
        self, states: Sequence[Any], actions: Sequence[Completion]
    ) -> TokenLogProbs:
        """Per-token log-probs (N, T), completion mask (N, T) and optional entropy (N, T).

        Without gradient (the rollout's old log-probs), actions sampled by another
        engine also get the gap between its log-probs and these in `rollout_metrics`.
        """
        if len(states) != len(actions):
            raise ValueError(f"states and actions must align; got {len(states)} and {len(actions)}")
        scorer = self.model if self.settings.precision not in COPIED else self.compute_model()
        out, metrics = score_completions(scorer, actions, self.scoring_settings())
        if not torch.is_grad_enabled():  # the rollout's pass: its statistics are rollout metrics
            if "entropy/mean" in metrics:
                self.rollout_metrics["entropy/rollout_mean"] = metrics["entropy/mean"]
            self.note_old_logprobs(actions, out.logprobs, out.completion_mask)
        return out

    def note_old_logprobs(self, actions: Sequence[Completion], old: Tensor, mask: Tensor) -> None:
        """Another sampler's gap to log π_old (N, T) in `rollout_metrics` (none for our own)."""
        self.rollout_metrics.update(gap_metrics(actions, old, mask, self._weight_cap()))

    def scoring_settings(self) -> ScoringSettings:
        """What scoring completions depends on, from this policy's settings."""
        s = self.settings
        return ScoringSettings(
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_ids=tuple(self.eos_token_ids),
            temperature=s.generation.temperature,
            micro_batch_size=s.micro_batch_size,
            compute_entropy=s.compute_entropy,
            chunked_output_layer=s.chunked_output_layer,
            mask_truncated_completions=s.mask_truncated_completions,
            share_prompt_prefix=s.share_prompt_prefix,
            pack_completions=s.pack_completions,
            precision=s.precision,
        )

    def loss_token_counts(self, states: Sequence[Any], actions: Sequence[Completion]) -> Tensor:
        """(N,) tokens the loss counts per completion, without scoring: up to and including
        the first EOS, none for a truncated one when `mask_truncated_completions`."""
        eos = set(self.eos_token_ids)
        masked = self.settings.mask_truncated_completions
        counts = [
            0 if masked and a.truncated else next(
                (k + 1 for k, t in enumerate(a.completion_ids) if t in eos), a.num_tokens
            )
            for a in actions
        ]  # fmt: skip
        return torch.tensor(counts, dtype=torch.long)

    @property
    def sampler_is_scorer(self) -> bool:
        """True when sampling and scoring are the same distribution (own model, no dropout)."""
        same_model = self.rollout_engine.samples_with_scorer
        truncated = self.settings.generation.truncates  # samples from q, scored as p
        return same_model and self.settings.disable_dropout and not truncated

    @property
    def train_pass_is_old(self) -> bool:
        """True when the gradient pass scores as the no-grad pass would: no dropout."""
        return self.settings.disable_dropout

    def rollout_importance_weights(
        self, actions: Sequence[Completion], old_logprobs: Tensor
    ) -> Tensor | None:
        """Importance weights π_old / π_sampler (N, T) for the loss, or None (all 1), where
        π_old is scored with the weights that sampled: for another engine (vLLM), capped at
        `rollout.tis_cap`; for top-k / top-p, which draws from q = p / Z on the kept set,
        p / q = Z <= 1 (capped at 1, clipping rounding)."""
        return importance_weights(actions, old_logprobs, self._weight_cap())

    def sampler_logprobs(self, actions: Sequence[Completion]) -> Tensor | None:
        """The log-probs (N, T') the engine recorded for each sampled token (0 past a
        completion's end), or None when it recorded none (it samples as the scorer scores)."""
        width = max((a.num_tokens for a in actions), default=0)
        recorded = engine_logprobs(actions, width)
        return None if recorded is None else recorded[0]

    def _weight_cap(self) -> float | None:
        """Cap of the importance weights: the engine's TIS cap, else 1 for truncated sampling
        with the trainer's own model, else None (no weights)."""
        if self.rollout_engine.tis_cap is not None:
            return self.rollout_engine.tis_cap
        return 1.0 if self.settings.generation.truncates else None

    def close(self) -> None:
        """Free what the rollout engine holds (vLLM's engine and memory); the model stays
        usable for scoring and saving. Safe to call twice."""
        close = getattr(self.rollout_engine, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> CausalLMPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------- reference
    def make_reference(self) -> Any:
        """A frozen reference: adapters disabled for PEFT, else a deep copy in eval mode."""
        if is_peft_model(self.model):
            return AdapterDisabledReference(self)
        model = copy.deepcopy(self.model)
        for p in model.parameters():
            p.requires_grad_(False)
        settings = copy.copy(self.settings)
        settings.gradient_checkpointing = False
        settings.compute_entropy = False  # the loss reads only π_ref's log-probs
        reference = CausalLMPolicy(model, self.tokenizer, settings)
        return reference.eval()

    def save_pretrained(self, path: str, *, merged: bool = False) -> Any:
        """Model (or LoRA adapter, plus `merged/` when asked) and tokenizer, as safetensors, with
        the licence files the model's source folder declares (`grpo.licence`)."""
        return save_model(self.model, self.tokenizer, path, merged=merged, licence=self.licence)


def _generation_metrics(completions: Sequence[Completion]) -> dict[str, float]:
    lengths = torch.tensor([c.num_tokens for c in completions], dtype=torch.float64)  # (N,)
    return {
        "completion/length_mean": lengths.mean().item(),
        "completion/length_max": lengths.max().item(),
        "completion/truncated_frac": sum(c.truncated for c in completions) / len(completions),
        "completion/eos_frac": sum(c.finished_by_eos for c in completions) / len(completions),
    }
