"""The "lean" rollout engine: a decoding loop over the model's own layers, nothing else per token.

For the Llama family (Llama, Mistral, Qwen2, Qwen3) and Gemma 3 text models, with or without
LoRA (`LEAN_MODEL_TYPES`). Each step runs the new tokens through the model's own modules and
its modelling file's `apply_rotary_pos_emb`, wired per family as
`grpo.lm.engines.lean_families.FAMILIES` says; only the attention over a cache allocated once
per rollout is written here. What it saves against `generate`, and the measurements:
docs/performance.md ("Choose the rollout engine"). On a GPU, vLLM is the engine to use.

Choices:
- Identical prompt rows (each prompt arrives G times) are prefilled once, then their logits
  and cache rows copied to every copy (`LeanDecoder.prefill`); decoding and draws unchanged.
- Rows that end (EOS or a stop string) leave the batch at once, their cache rows dropped;
  each step reads back which rows ended (one small device-to-host copy).
- Sampling is `grpo.functional.sampling` (temperature, top-k, top-p, in `generate`'s order)
  under the transformers engine's seeded, forked RNG; draws differ from `generate`'s once
  rows leave the batch.
- Under bf16-mixed over float32 weights the loop runs on a copy whose matrices are cast to
  bfloat16 once per rollout (`LowPrecisionCopy`, LoRA merged in), not at every token as
  autocast would; the residual stream, norms, rotary angles and cache stay float32, and
  attention over the cache runs in float32 (bfloat16 kernels at one query token were 3.3x
  slower on a CPU: docs/performance.md).
- Before its first rollout the engine checks that a short probe's logits, prefilled then
  decoded token by token, equal the model's plain forward to the dtype's rounding.
- A model with a sliding attention window is refused when prompt + completion exceeds its
  smallest window (within it, every layer's attention over the cache is exact); Gemma 3 with
  soft-capped attention scores or bidirectional attention is refused by name.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.functional.sampling import choose_tokens, sampled_logprobs
from grpo.lm.engines.base import Samples, sample_in_chunks
from grpo.lm.engines.lean_families import FAMILIES
from grpo.lm.engines.low_precision import LowPrecisionCopy
from grpo.lm.engines.transformers import TransformersEngine
from grpo.lm.loading import is_peft_model
from grpo.lm.sampling import GenerationSettings
from grpo.precision import AUTOCAST_TWIN, PRECISIONS, compute_dtype

__all__ = ["LEAN_MODEL_TYPES", "LeanDecoder", "LeanEngine"]

LEAN_MODEL_TYPES = tuple(FAMILIES)

# largest |lean - forward| logit gap accepted by the self-check, relative to max |logit| + 1
_CHECK_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}
_HALF_TOLERANCE = 5e-2  # bfloat16 / float16


class LeanDecoder:
    """The model's layers run one decoding step at a time over a preallocated cache."""

    def __init__(
        self, model: nn.Module, share_prefill: bool = True, state_dtype: torch.dtype | None = None
    ) -> None:
        """`share_prefill`: run each distinct prompt row once (see `prefill`); `state_dtype`:
        the residual stream's, rotary angles' and cache's dtype (None = the weights')."""
        self.share_prefill = share_prefill
        self.state_dtype = state_dtype
        lm = model.get_base_model() if is_peft_model(model) else model
        self.config = config = lm.config
        if config.model_type not in FAMILIES:
            raise ValueError(
                f"rollout.engine 'lean': model type {config.model_type!r} is not supported; "
                f"allowed: {', '.join(LEAN_MODEL_TYPES)} (use rollout.engine 'transformers')"
            )
        self.family = FAMILIES[config.model_type]
        reason = self.family.unsupported(config)
        if reason is not None:
            raise ValueError(
                f"rollout.engine 'lean': this {config.model_type} model has {reason}, which the "
                "loop does not compute; use rollout.engine 'transformers'"
            )
        self.body = lm.model
        self.lm_head = lm.lm_head
        first = self.body.layers[0].self_attn
        self.rope = getattr(inspect.getmodule(type(first)), "apply_rotary_pos_emb", None)
        if self.rope is None:  # pragma: no cover - every supported modelling file defines it
            raise ValueError(f"rollout.engine 'lean': {type(first).__name__} has no rotary helper")
        self.head_dim = first.head_dim
        self.kv_heads = config.num_key_value_heads
        self.gqa = config.num_attention_heads != config.num_key_value_heads
        kinds = self.family.layer_kinds(config)  # each layer's rotary angles
        self.kinds = sorted(set(kinds))
        self.kind_of = [self.kinds.index(kind) for kind in kinds]  # layer -> row of `rotary`
        # a layer's own window where its module has one (Qwen2/3, Gemma 3: None on full layers)
        windows = [
            getattr(layer.self_attn, "sliding_window", getattr(config, "sliding_window", None))
            for layer in self.body.layers
        ]
        self.window = min((w for w in windows if w is not None), default=None)

    def check_length(self, length: int) -> None:
        """Refuse prompt + completion lengths past a sliding attention window."""
        if self.window is not None and length > self.window:
            raise ValueError(
                f"rollout.engine 'lean': prompt + max_new_tokens = {length} tokens exceeds the "
                f"model's sliding attention window of {self.window}; use rollout.engine "
                "'transformers'"
            )

    def rotary(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin of the rotary embedding at positions (n, L) -> (K, n, L, head_dim) each,
        one row per kind of layer (`kinds`; Gemma 3: sliding and full attention)."""
        probe = torch.empty(0, dtype=dtype, device=positions.device)  # only its dtype/device used
        pairs = [
            self.family.angles(self.body.rotary_emb, probe, positions, kind) for kind in self.kinds
        ]
        return torch.stack([c for c, _ in pairs]), torch.stack([s for _, s in pairs])

    def new_cache(self, n: int, length: int, dtype: torch.dtype, device: Any) -> list[Tensor]:
        """Keys and values of every layer, allocated once: 2 * layers tensors (n, kv, L, D)."""
        shape = (n, self.kv_heads, length, self.head_dim)
        return [
            torch.empty(shape, dtype=dtype, device=device) for _ in range(2 * len(self.body.layers))
        ]

    def step(
        self,
        ids: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: list[Tensor],
        start: int,
        attend: Tensor,
    ) -> Tensor:
        """Run new tokens ids (n, S) at cache columns start..start+S-1 -> last logits (n, V).

        cos, sin: (K, n, S, D) of their positions; attend: (n, 1, S, start + S) bool, which
        cached and new keys each new token sees.
        """
        x = self.body.embed_tokens(ids)  # (n, S, H); Gemma's module scales by sqrt(H) itself
        if self.state_dtype is not None:
            x = x.to(self.state_dtype)
        angles = list(zip(cos, sin, strict=True))  # K pairs (n, S, D)
        for i, layer in enumerate(self.body.layers):
            keys_values = cache[2 * i : 2 * i + 2]
            attention = functools.partial(
                self._attend, layer.self_attn, angles[self.kind_of[i]], keys_values, start, attend
            )
            x = self.family.block(layer, x, attention)  # (n, S, H)
        logits = self.lm_head(self.body.norm(x[:, -1]))  # (n, V)
        return self.family.cap_logits(logits, self.config)

    def _attend(self, attn: nn.Module, angles: tuple[Tensor, Tensor], keys_values: list[Tensor],
                start: int, attend: Tensor, h: Tensor) -> Tensor:  # fmt: skip
        """One layer's attention: normed h (n, S, H) -> its o_proj output (n, S, H), with its
        keys and values [(n, kv, L, D)] * 2 written at columns start..start+S-1; angles: this
        layer's cos, sin (n, S, D)."""
        n, S, _ = h.shape
        end = start + S
        cos, sin = angles
        q = attn.q_proj(h).view(n, S, -1, self.head_dim)  # (n, S, heads, D)
        k = attn.k_proj(h).view(n, S, -1, self.head_dim)  # (n, S, kv, D)
        v = attn.v_proj(h).view(n, S, -1, self.head_dim).transpose(1, 2)  # (n, kv, S, D)
        if hasattr(attn, "q_norm"):  # Qwen3, Gemma 3 normalise each head's queries and keys
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        keys, values = keys_values
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        with self._attention_context(h.device.type):
            out = F.scaled_dot_product_attention(
                q.to(keys.dtype), keys[:, :, :end], values[:, :, :end],
                attn_mask=attend, scale=attn.scaling, enable_gqa=self.gqa,
            )  # (n, heads, S, D) in the cache's dtype  # fmt: skip
        return attn.o_proj(out.transpose(1, 2).reshape(n, S, -1))

    def _attention_context(self, device_type: str) -> Any:
        """Autocast off around attention when the cache holds `state_dtype` (float32 keys and
        values under a bfloat16 copy); as the caller has it otherwise."""
        if self.state_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, enabled=False)

    def decode(
        self,
        ids: Tensor,
        mask: Tensor,
        settings: GenerationSettings,
        eos_ids: Sequence[int],
        stopped: Any = None,
        logits_out: list[Tensor] | None = None,
        logprobs_out: list[list[float]] | None = None,
    ) -> list[list[int]]:
        """New tokens of left-padded rows ids (n, P), mask (n, P) -> n rows of <= T ids.

        A row ends after an EOS id, or when `stopped(row_index, new_ids)` says so.
        `logits_out`, if given, receives each step's logits (rows still decoding, V);
        `logprobs_out` (n empty lists), each token's log-prob under the sampled distribution.
        """
        P, T = ids.shape[1], settings.max_new_tokens
        self.check_length(P + T)
        dtype, device = self.state_dtype or self.lm_head.weight.dtype, ids.device
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (n, P) left padding shifts nothing
        steps = torch.arange(1, T + 1, device=device)
        positions = torch.cat([positions, positions[:, -1:] + steps], 1)  # (n, P + T)
        cos, sin = self.rotary(positions, dtype)  # (K, n, P + T, D)
        with torch.inference_mode():  # nothing made from here on is ever used with autograd
            return self._run(
                ids, mask, cos, sin, settings, eos_ids, stopped, logits_out, logprobs_out
            )

    def _run(
        self,
        ids: Tensor,
        mask: Tensor,
        cos: Tensor,
        sin: Tensor,
        settings: GenerationSettings,
        eos_ids: Sequence[int],
        stopped: Any,
        logits_out: list[Tensor] | None,
        logprobs_out: list[list[float]] | None = None,
    ) -> list[list[int]]:
        """`decode` once the rotary angles cos, sin (K, n, P + T, D) are known."""
        (n, P), T = ids.shape, settings.max_new_tokens
        device = ids.device
        visible = torch.zeros(n, 1, 1, P + T, dtype=torch.bool, device=device)
        visible[:, 0, 0, :P] = mask.bool()  # (n, 1, 1, P + T) keys each row may see
        logits, cache = self.prefill(ids, mask, cos, sin, P + T)  # (n, V), (n, kv, P + T, D)
        eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
        rows = list(range(n))  # original index of each row still decoding
        new: list[list[int]] = [[] for _ in range(n)]
        for t in range(T):
            if logits_out is not None:
                logits_out.append(logits)
            token = choose_tokens(
                logits, settings.do_sample, settings.temperature, settings.top_k, settings.top_p
            )  # (r,)
            if logprobs_out is not None:
                logq = sampled_logprobs(
                    logits, token, settings.temperature, settings.top_k, settings.top_p
                ).tolist()  # (r,)
                for row, value in zip(rows, logq, strict=True):
                    logprobs_out[row].append(value)
            ended = torch.isin(token, eos).tolist()
            for j, (row, tok) in enumerate(zip(rows, token.tolist(), strict=True)):
                new[row].append(tok)
                if stopped is not None and not ended[j]:
                    ended[j] = stopped(row, new[row])
            if t == T - 1 or all(ended):
                break
            if any(ended):  # finished rows leave the batch, cache included
                keep = torch.tensor([not e for e in ended], device=device)
                rows = [row for row, e in zip(rows, ended, strict=True) if not e]
                token, cos, sin, visible = token[keep], cos[:, keep], sin[:, keep], visible[keep]
                for i, c in enumerate(cache):  # one layer at a time: at most one extra copy
                    cache[i] = c[keep]
            column = P + t
            visible[:, 0, 0, column] = True
            logits = self.step(
                token[:, None],
                cos[:, :, column : column + 1],
                sin[:, :, column : column + 1],
                cache,
                column,
                visible[:, :, :, : column + 1],
            )
        return new

    def prefill(
        self, ids: Tensor, mask: Tensor, cos: Tensor, sin: Tensor, length: int
    ) -> tuple[Tensor, list[Tensor]]:
        """Run the prompts ids (n, P) into a new cache of `length` columns -> (last logits
        (n, V), cache). With `share_prefill`, identical rows (a prompt's G copies) run once
        and their logits and cache rows are then copied to each of them."""
        P = ids.shape[1]
        cos, sin = cos[:, :, :P], sin[:, :, :P]  # (K, n, P, D)
        index = self._distinct_rows(ids, mask) if self.share_prefill else None
        if index is not None:  # (n,) which of the u distinct rows each row is
            first = torch.empty(int(index.max()) + 1, dtype=torch.long, device=ids.device)
            first.scatter_(0, index, torch.arange(len(index), device=ids.device))  # (u,)
            ids, mask = ids.index_select(0, first), mask.index_select(0, first)
            cos, sin = cos.index_select(1, first), sin.index_select(1, first)
        cache = self.new_cache(ids.shape[0], length, cos.dtype, ids.device)
        causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()  # (P, P)
        diagonal = torch.eye(P, dtype=torch.bool, device=ids.device)  # a pad query sees itself only
        attend = (mask.bool()[:, None, None, :] & causal) | diagonal  # (u, 1, P, P)
        logits = self.step(ids, cos, sin, cache, 0, attend)  # (u, V)
        if index is None:
            return logits, cache
        return logits.index_select(0, index), [c.index_select(0, index) for c in cache]

    @staticmethod
    def _distinct_rows(ids: Tensor, mask: Tensor) -> Tensor | None:
        """(n,) index of each row among the distinct rows of ids, mask (n, P); None when
        all n differ. A row is its ids and its mask: a pad id can also be a real token."""
        distinct, index = torch.unique(torch.cat([ids, mask], 1), dim=0, return_inverse=True)
        return index if distinct.shape[0] < ids.shape[0] else None

    def check(self, model: nn.Module, probe: Sequence[int], new: int = 2) -> float:
        """Largest gap between this loop's logits and the model's forward on probe + new tokens,
        relative to max |logit| + 1; raises if it is past the dtype's rounding."""
        ids = torch.tensor([list(probe)], device=self.lm_head.weight.device)  # (1, P)
        P = ids.shape[1]
        settings = GenerationSettings(max_new_tokens=new + 1, do_sample=False)
        got: list[Tensor] = []  # (1, V) per step: after the prompt, then after each new token
        tokens = self.decode(ids, torch.ones_like(ids), settings, (), logits_out=got)[0]
        full = torch.cat([ids, torch.tensor([tokens], device=ids.device)], 1)  # (1, P + new + 1)
        want = model(input_ids=full[:, :-1]).logits[0, P - 1 :].float()  # (new + 1, V)
        dtype = compute_dtype(self.lm_head.weight.dtype, ids.device.type)  # autocast's, if on
        gap = ((torch.cat(got).float() - want).abs().max() / (want.abs().max() + 1)).item()
        tolerance = _CHECK_TOLERANCE.get(dtype, _HALF_TOLERANCE)
        if not gap <= tolerance:
            raise RuntimeError(
                f"rollout.engine 'lean': its logits differ from the model's forward by {gap:.2e} "
                f"(relative; allowed {tolerance:.0e}) on this {type(model).__name__}; use "
                "rollout.engine 'transformers'"
            )
        return gap


class LeanEngine(TransformersEngine):
    """Samples with the trainer's model through `LeanDecoder` (see the module docstring);
    eval mode, no_grad and the restored mode as `TransformersEngine`."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        precision: str = "fp32",
        scorer_precision: str = "fp32",
        tis_cap: float | None = None,
    ) -> None:
        """Arguments as `TransformersEngine`'s."""
        super().__init__(model, tokenizer, precision, scorer_precision, tis_cap)
        self.decoder = LeanDecoder(model)
        self.low: LowPrecisionCopy | None = None  # built at the first low-precision rollout
        self.low_decoder: LeanDecoder | None = None  # over `low`
        self.check_gap: float | None = None
        """The self-check's relative logit gap, once the first rollout has run it."""

    def context_precision(self) -> str:
        """Autocast's twin of a copied precision (bf16-copy -> bf16-mixed): this engine holds
        the float32 model and samples from its own bfloat16 copy, as under bf16-mixed."""
        return AUTOCAST_TWIN.get(self.precision, self.precision)

    def _rollout_decoder(self) -> LeanDecoder:
        """The decoder over the model itself, or, for a low precision over float32 weights,
        over `LowPrecisionCopy` refreshed from the model's current weights."""
        low = PRECISIONS[self.precision]
        if low is None or self.decoder.lm_head.weight.dtype != torch.float32:
            return self.decoder
        if self.low is None:
            self.low = LowPrecisionCopy(self.model, low)
            self.low_decoder = LeanDecoder(self.low.model, state_dtype=torch.float32)
        self.low.refresh()
        return self.low_decoder

    def _samples(
        self,
        prompt_rows: Sequence[Sequence[int]],
        settings: GenerationSettings,
        eos_ids: list[int],
        seed: int | None,
    ) -> Samples:
        decoder = self._rollout_decoder()
        if self.check_gap is None:
            self.check_gap = decoder.check(self.model, prompt_rows[0])
        return sample_in_chunks(
            prompt_rows,
            settings,
            seed,
            self.tokenizer.pad_token_id,
            decoder.lm_head.weight.device,
            lambda ids, mask: self._decode(decoder, ids, mask, settings, eos_ids),
        )

    def _decode(
        self,
        decoder: LeanDecoder,
        ids: Tensor,
        mask: Tensor,
        settings: GenerationSettings,
        eos_ids: list[int],
    ) -> Samples:
        stopped = None
        if settings.stop_strings:
            decode = self.tokenizer.decode

            def stopped(row: int, new: list[int]) -> bool:
                text = decode(new)
                return any(s in text for s in settings.stop_strings)

        report = self.reports_logprobs(settings)
        logq: list[list[float]] | None = [[] for _ in range(ids.shape[0])] if report else None
        new = decoder.decode(ids, mask, settings, eos_ids, stopped, logprobs_out=logq)
        return Samples(new, logq)
