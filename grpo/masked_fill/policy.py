"""A policy that fills every masked position of an input in one step (the fill-in plan).

The model is bidirectional: any `transformers` `AutoModelForMaskedLM`, or a
user's torch module mapping token ids (N, T) to logits (N, T, V). A state is
a 1-D sequence of token ids in which some positions hold `mask_token_id`; an
action is the same sequence with every masked position filled. Sampling draws
all masked positions at once and independently (one denoising step), with
temperature and nucleus (top-p) truncation; unmasked positions are copied
through unchanged, so they are never part of the action's probability.

    log π(action | state) = Σ_{t masked} log softmax(logits_t / temperature)[action_t]

Departures from the fill-in plan:
- Log-probabilities use the sampling temperature. The plan scores samples
  with a plain `log_softmax(logits)`, which is not the distribution they were
  drawn from whenever temperature != 1, so the importance ratio and the KL
  would be biased.
- Log-probabilities do not apply the top-p truncation: they are those of the
  temperature-scaled distribution, as in most GRPO implementations, so the
  reference model can score any sampled token with a finite value.
- Tokens listed in `suppress_token_ids` (for example the mask and padding
  tokens) get probability zero in both sampling and scoring, so the policy is
  one consistent distribution (the plan restricts sampling to a base
  vocabulary but scores over the full one).
- Every pass runs the model in eval mode (`disable_dropout`, on by default),
  the gradient pass included: the fill-in plan samples in eval mode but trains in
  training mode, where dropout makes the same fill score differently on every
  pass, so the importance ratio is noise before any update (a BERT with its
  default dropout 0.1: ratio mean 0.9976, 0.63 % of tokens clipped at
  π = π_old). Eval mode rather than setting `nn.Dropout.p = 0` because a
  model may drop out without an `nn.Dropout` module: attention dropout
  passed to `scaled_dot_product_attention` as `dropout_p` when
  `self.training` (transformers' BERT reads `attention_probs_dropout_prob`),
  `F.dropout(..., training=self.training)`. Eval mode also makes a BatchNorm
  use (and no longer update) its running statistics.
- Loss, advantages and KL are not computed here: the policy offers
  per-token log-probabilities with a `completion_mask` equal to the masked
  positions (`TokenLevelPolicy`), and the trainer applies `grpo.functional`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from grpo.functional import (
    draw_indices,
    entropy_from_logits,
    filter_logits,
    selective_log_softmax,
)
from grpo.precision import check_precision, compute_precision, resolve_precision
from grpo.protocols import TokenLogProbs

__all__ = ["MaskedFillConfig", "MaskedFillPolicy", "REDUCTIONS"]


def _sum_over_mask(logprobs: Tensor, completion_mask: Tensor) -> Tensor:
    return (logprobs * completion_mask).sum(-1)  # (N, T) -> (N,)


def _mean_over_mask(logprobs: Tensor, completion_mask: Tensor) -> Tensor:
    # An input without masked positions has an empty action: log-prob 0, not 0/0.
    count = completion_mask.sum(-1).clamp(min=1)  # (N,)
    return (logprobs * completion_mask).sum(-1) / count  # (N,)


def pad_rows(rows: Sequence[Tensor], pad: int) -> tuple[Tensor, Tensor]:
    """1-D id rows right-padded with `pad` -> ids (N, T), and attention (N, T), True = a real
    token; T is the longest row."""
    lengths = torch.tensor([row.numel() for row in rows])  # (N,)
    ids = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)  # (N, T)
    for n, row in enumerate(rows):
        ids[n, : row.numel()] = row
    return ids, torch.arange(ids.shape[1])[None, :] < lengths[:, None]


def forward_padded(model: nn.Module, ids: Tensor, attention: Tensor) -> Any:
    """`model`'s output for padded ids (N, T), told where the padding is (attention (N, T),
    True = a real token) when it can be: a `transformers` model, or a module whose forward
    takes `attention_mask`. Any other module sees the padding tokens as tokens."""
    if hasattr(model, "config") and hasattr(model, "get_input_embeddings"):
        return model(input_ids=ids, attention_mask=attention.long())
    try:
        takes_mask = "attention_mask" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature
        takes_mask = False
    return model(ids, attention_mask=attention.long()) if takes_mask else model(ids)


REDUCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sum": _sum_over_mask,
    "mean": _mean_over_mask,
}
"""How `get_log_probabilities` turns per-position log-probs into one per sample."""

_SUPPRESSED_LOGIT = -1e30
"""Logit given to suppressed token ids: exp() of it underflows to 0, yet it stays finite."""


@dataclass
class MaskedFillConfig:
    """How a `MaskedFillPolicy` samples and scores fills."""

    mask_token_id: int
    """Token id that marks a position to fill; the masked positions are the action."""
    pad_token_id: int | None = None
    """Token id used to pad inputs of different lengths (needed only then)."""
    temperature: float = 1.0
    """Softmax temperature, used for sampling AND for log-probabilities (> 0)."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens with mass >= top_p, in (0, 1]."""
    reduction: str = "sum"
    """How `get_log_probabilities` combines masked positions: a key of `REDUCTIONS`."""
    compute_entropy: bool = False
    """Return the per-position entropy with the token log-probs (costs one pass over V)."""
    suppress_token_ids: tuple[int, ...] = ()
    """Token ids never sampled and given probability zero (mask, padding, specials)."""
    precision: str = "fp32"
    """What the model's forward and backward compute in (`grpo.precision`): fp32, bf16-mixed
    or fp16-mixed (autocast over the model's own weights, on a CPU or a GPU; fp16-mixed needs
    a gradient scaler in the trainer), or auto (bf16-mixed where bfloat16 matrix products
    beat float32 on the model's device, else fp32; resolved when the policy is built).
    Log-probs are float32 in every case."""
    autocast_dtype: str | None = None
    """Older spelling of `precision`, still accepted: 'bfloat16' = bf16-mixed, 'float16' =
    fp16-mixed. It used to apply on a GPU only; now, as `precision`, on a CPU too."""
    disable_dropout: bool = True
    """Run the model in eval mode in every pass, the gradient pass included, so dropout
    (any module that checks `self.training`) is off and a fill scores the same in the
    rollout and in training. False: training-mode gradient passes, with dropout noise
    in the importance ratio (see the module docstring)."""

    def __post_init__(self) -> None:
        self.suppress_token_ids = tuple(int(i) for i in self.suppress_token_ids)
        checks = [
            ("mask_token_id", self.mask_token_id, isinstance(self.mask_token_id, int) and self.mask_token_id >= 0, "an int >= 0"),
            ("pad_token_id", self.pad_token_id, self.pad_token_id is None or (isinstance(self.pad_token_id, int) and self.pad_token_id >= 0), "None or an int >= 0"),
            ("temperature", self.temperature, isinstance(self.temperature, (int, float)) and self.temperature > 0, "a number > 0"),
            ("top_p", self.top_p, isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("reduction", self.reduction, self.reduction in REDUCTIONS, f"one of {sorted(REDUCTIONS)}"),
            ("autocast_dtype", self.autocast_dtype, self.autocast_dtype in (None, "bfloat16", "float16"), "None, 'bfloat16' or 'float16'"),
            ("suppress_token_ids", self.suppress_token_ids, all(i >= 0 for i in self.suppress_token_ids), "non-negative token ids"),
            ("disable_dropout", self.disable_dropout, isinstance(self.disable_dropout, bool), "True or False"),
        ]  # fmt: skip
        for field, value, ok, allowed in checks:
            if not ok:
                raise ValueError(
                    f"MaskedFillConfig.{field}={value!r} is invalid: expected {allowed}"
                )
        if self.pad_token_id == self.mask_token_id:  # padding would be filled and scored
            raise ValueError(
                f"MaskedFillConfig.pad_token_id={self.pad_token_id!r} equals mask_token_id: "
                "padding must differ from the mask, or padded positions would be filled"
            )
        if self.autocast_dtype is not None:  # the older spelling wins where it was set
            self.precision = self.autocast_dtype
            self.autocast_dtype = None
        self.precision = check_precision(
            "MaskedFillConfig.precision", self.precision, auto=True, copy=False
        )


class MaskedFillPolicy:
    """`PolicyModel` + `TokenLevelPolicy` for one-step masked fill-in models.

    States are 1-D token-id sequences (tensors or lists of ints) containing
    `config.mask_token_id`; actions are 1-D `LongTensor`s of the same length
    (on the CPU) with every masked position filled.
    """

    def __init__(
        self,
        model: nn.Module,
        config: MaskedFillConfig,
        *,
        generator: torch.Generator | None = None,
        frozen: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(config, MaskedFillConfig):
            raise TypeError(f"config must be a MaskedFillConfig, got {type(config).__name__}")
        self.model = model
        self.config = config
        device = next(model.parameters()).device
        config.precision = resolve_precision("MaskedFillConfig.precision", config.precision, device)
        self.generator = generator
        """Optional RNG for sampling (must live on the model's device); else the global one."""
        self.frozen = frozen
        """A frozen policy (a reference) stays in eval mode and exposes no parameters."""
        self._suppress = torch.tensor(config.suppress_token_ids, dtype=torch.long)
        if frozen:
            model.eval().requires_grad_(False)

    def sampling_state(self) -> dict[str, Tensor] | None:
        """The sampling generator's state (None: sampling draws from the global RNG)."""
        return None if self.generator is None else {"generator": self.generator.get_state()}

    def load_sampling_state(self, state: dict[str, Tensor] | None) -> None:
        if state is not None and self.generator is not None:
            self.generator.set_state(state["generator"])

    # ----------------------------------------------------------------- inputs
    @property
    def device(self) -> torch.device:
        first = next(self.model.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    def _collate(self, sequences: Sequence[Any], name: str) -> tuple[Tensor, Tensor]:
        """Stack 1-D id sequences into ids (N, T) and attention (N, T), padding if needed."""
        if len(sequences) == 0:
            raise ValueError(f"{name} is empty: expected at least one token-id sequence")
        rows = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
        for n, row in enumerate(rows):
            if row.dim() != 1 or row.numel() == 0:
                raise ValueError(
                    f"{name}[{n}] has shape {tuple(row.shape)}: expected a non-empty 1-D sequence of token ids"
                )
        lengths = torch.tensor([row.numel() for row in rows])
        T = int(lengths.max())
        if bool((lengths != T).any()) and self.config.pad_token_id is None:
            raise ValueError(
                f"{name} holds sequences of lengths {sorted(set(lengths.tolist()))}: "
                "set MaskedFillConfig.pad_token_id to pad them"
            )
        pad = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        ids, attention = pad_rows(rows, pad)
        return ids.to(self.device), attention.to(self.device)

    @contextmanager
    def _eval_mode(self, always: bool) -> Iterator[None]:
        """The model in eval mode inside (when `always` or `disable_dropout`), its mode restored after."""
        was_training = self.model.training
        if was_training and (always or self.config.disable_dropout):
            self.model.eval()  # dropout off: the fill scored is one of the policy sampled
        try:
            yield
        finally:
            self.model.train(was_training)

    def _logits(self, ids: Tensor, attention: Tensor, *, sampling: bool = False) -> Tensor:
        """Model forward: ids (N, T) -> logits (N, T, V), in `config.precision`.

        Eval mode when sampling, and in every pass with `disable_dropout`."""
        autocast = compute_precision(self.config.precision, ids.device.type)
        with self._eval_mode(always=sampling), autocast:
            out = forward_padded(self.model, ids, attention)
        logits = getattr(out, "logits", out)
        if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(
                f"model must map ids {tuple(ids.shape)} to logits (N, T, V), got {got}"
            )
        return logits

    def _masked_logits(self, logits: Tensor, completion_mask: Tensor) -> Tensor:
        """Logits of the masked positions only, at least fp32, suppressed ids floored: (M, V).

        Temperature is NOT applied here: sampling and scoring both divide by
        `config.temperature` themselves, visibly.
        """
        dtype = torch.promote_types(logits.dtype, torch.float32)
        rows = logits[completion_mask].to(dtype)  # (M, V)
        if self._suppress.numel():
            # A large finite floor, not -inf: probability exactly 0 after any temperature,
            # without the 0 * inf = nan that -inf gives in an entropy.
            rows = rows.index_fill(-1, self._suppress.to(rows.device), _SUPPRESSED_LOGIT)
        return rows

    # --------------------------------------------------------------- sampling
    @torch.no_grad()
    def fill(self, states: Sequence[Any]) -> Tensor:
        """One sampled fill per state: (N,) states -> actions (N, T) on the CPU (padded)."""
        ids, attention = self._collate(states, "states")
        completion_mask = ids == self.config.mask_token_id  # (N, T)
        if not bool(completion_mask.any()):  # nothing to fill: every action is its state
            return ids.cpu()
        logits = self._logits(ids, attention, sampling=True)  # (N, T, V)
        masked = self._masked_logits(logits, completion_mask)  # (M, V)
        # nucleus truncation as every engine applies it (Holtzman et al. 2020)
        probs = filter_logits(masked / self.config.temperature, top_p=self.config.top_p).softmax(-1)
        tokens = draw_indices(probs, self.generator)  # (M,)
        actions = ids.clone()
        actions[completion_mask] = tokens  # unmasked positions are copied through
        return actions.cpu()

    def generate_actions(
        self, states: list[Any], num_actions_per_state: int, **kwargs: Any
    ) -> list[list[Tensor]]:
        """Sample G fills per state: (B,) -> (B, G); sample n = i * G + j is fill j of state i."""
        G = num_actions_per_state
        if not isinstance(G, int) or G < 1:
            raise ValueError(f"num_actions_per_state={G!r} is invalid: expected an int >= 1")
        if kwargs:
            raise TypeError(f"generate_actions got unexpected arguments {sorted(kwargs)}")
        repeated = [s for s in states for _ in range(G)]  # groups contiguous, in order
        lengths = [len(s) for s in repeated]
        actions = self.fill(repeated)  # (B * G, T)
        flat = [actions[n, :length] for n, length in enumerate(lengths)]
        return [flat[i * G : (i + 1) * G] for i in range(len(states))]

    # ---------------------------------------------------------------- scoring
    def get_token_log_probabilities(
        self, states: Sequence[Any], actions: Sequence[Any]
    ) -> TokenLogProbs:
        """Per-position log π(action_t | state) (N, T); completion_mask = masked positions."""
        if len(states) != len(actions):
            raise ValueError(
                f"states and actions must be aligned: got {len(states)} states, {len(actions)} actions"
            )
        ids, attention = self._collate(states, "states")
        action_ids, _ = self._collate(actions, "actions")
        for n, (state, action) in enumerate(zip(states, actions, strict=True)):
            if len(action) != len(state):  # padding would hide it
                raise ValueError(
                    f"actions[{n}] has {len(action)} tokens, states[{n}] {len(state)}: "
                    "each action must have its state's length"
                )
        self._check_actions(ids, attention, action_ids)
        completion_mask = ids == self.config.mask_token_id  # (N, T)
        masked = self._masked_logits(self._logits(ids, attention), completion_mask)  # (M, V)
        temperature = self.config.temperature  # the sampling temperature (the fill-in plan omits it)
        masked_logprobs = selective_log_softmax(
            masked, action_ids[completion_mask], temperature=temperature
        )  # (M,)
        # Unmasked positions stay exactly 0 and receive no gradient.
        logprobs = masked.new_zeros(ids.shape).masked_scatter(completion_mask, masked_logprobs)
        entropy = None
        if self.config.compute_entropy:
            masked_entropy = entropy_from_logits(masked, temperature)  # (M,)
            entropy = masked.new_zeros(ids.shape).masked_scatter(completion_mask, masked_entropy)
        return TokenLogProbs(logprobs, completion_mask, entropy)

    def get_log_probabilities(self, states: list[Any], actions: list[Any]) -> Tensor:
        """log π(action_i | state_i) summed (or averaged) over masked positions: (N,)."""
        token = self.get_token_log_probabilities(states, actions)
        return REDUCTIONS[self.config.reduction](token.logprobs, token.completion_mask)

    def _check_actions(self, ids: Tensor, attention: Tensor, action_ids: Tensor) -> None:
        kept = attention & (ids != self.config.mask_token_id)  # (N, T) positions copied through
        changed = (kept & (action_ids != ids)).any(-1)  # (N,)
        if bool(changed.any()):
            row = int(changed.nonzero()[0])
            raise ValueError(
                f"actions[{row}] differs from states[{row}] at an unmasked position: "
                "a fill may change masked positions only"
            )

    # ------------------------------------------------------ PolicyModel misc
    def get_parameters(self) -> dict[str, Tensor]:
        """Trainable parameters by name (none for a frozen policy)."""
        if self.frozen:
            return {}
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def make_reference(self) -> MaskedFillPolicy:
        """A frozen copy of the current model: eval mode, no gradients, same config."""
        return MaskedFillPolicy(copy.deepcopy(self.model), self.config, generator=None, frozen=True)

    def state_dict(self) -> dict[str, Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> Any:
        return self.model.load_state_dict(state_dict)

    def train(self, mode: bool = True) -> MaskedFillPolicy:
        self.model.train(mode and not self.frozen)
        return self

    def eval(self) -> MaskedFillPolicy:
        self.model.eval()
        return self

    def to(self, device: Any) -> MaskedFillPolicy:
        self.model.to(device)
        return self
