"""The work of a GRPO step's phases, counted from a model's shape: FLOPs and bytes, pure functions.

`bench/roofline.py` divides each phase's measured time by the least time this work could take
at the machine's measured peaks. The counts follow the usual model-FLOPs convention (Kaplan et
al. 2020; PaLM's "model FLOPs utilisation", Chowdhery et al. 2022):

- a forward costs 2 FLOPs per weight of a matrix product per token (one multiply, one add), plus
  attention's two products QK^T and AV: 2 x head_dim FLOPs each per head, per query, per key
  it attends to, over the causal keys only (a query at context c attends to c keys; on a
  layer with a sliding window of W keys, to min(c, W): Gemma 3's sliding layers, every layer
  of a Mistral with `sliding_window` set);
- the output layer, 2 x hidden x vocab FLOPs per row of logits;
- a backward computes, for every matrix product, the gradient of its input (as many FLOPs as
  its forward) and, for a trained weight only, the gradient of that weight (as many again);
  attention's two products have two input gradients each (twice their forward). Under full
  fine-tuning a backward is therefore twice its forward. A frozen weight (`model.freeze`,
  `Trainable`) gets no weight gradient, but its input gradient stays: a frozen output layer
  (tied to a frozen embedding) still passes the loss's gradient down to the layers. The input
  gradient is counted for every product: it is needed wherever something below it trains,
  and with only the embedding frozen the first layer's input norm still does (a model frozen
  from the bottom up would need fewer, which is not counted);
- embeddings (a gather), norms (Gemma 3's q and k norms and its four per layer included),
  activations, rotary angles, the softmax and logit soft-capping are left out: they are a few
  FLOPs per element against hundreds per weight.

What is counted is the work the step needs, not what an implementation does: each distinct
prompt once per group, the real tokens of each completion and no padding, no recomputation
(activation checkpointing, the folded output layer's backward), no key outside a sliding window
(which eager attention computes and masks). These therefore show up as time above the limit.

Names: H hidden size, L layers, I intermediate size, V vocabulary, h attention heads, k key-value
heads, d head size (Gemma 3's is its own, not H / h), W the sliding window, L_w the layers that
use it. P prompt tokens, T_j the tokens of completion j of a group.

Supported: decoder-only models with a gated MLP (gate, up and down projections), i.e. the
families of the lean engine: llama, mistral, qwen2, qwen3, gemma3_text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GATED_MLP_MODEL_TYPES",
    "ModelShape",
    "Trainable",
    "adamw_bytes",
    "attention_flops",
    "backward_flops",
    "clip_bytes",
    "context_sum",
    "decoding_bytes",
    "layer_keys",
    "layer_matmul_params",
    "limit_seconds",
    "loss_pass_bytes",
    "matmul_params",
    "output_layer_flops",
    "sampling_flops",
    "scoring_flops",
    "times_the_limit",
    "token_flops",
    "weight_pass_bytes",
]

GATED_MLP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


@dataclass(frozen=True)
class ModelShape:
    """What the counts read of a model's config."""

    hidden: int  # H
    layers: int  # L
    heads: int  # h, query heads
    kv_heads: int  # k, key-value heads (grouped-query attention: k divides h)
    head_dim: int  # d (H / h unless the config says otherwise, as Gemma 3's does)
    intermediate: int  # I, the MLP's inner width
    vocab: int  # V
    window: int | None = None  # W, the keys a sliding layer attends to at most; None: no window
    window_layers: int = 0  # L_w, the layers with that window (the other L - L_w attend to all)

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """The shape of a transformers config of a `GATED_MLP_MODEL_TYPES` model. The sliding
        layers are those `config.layer_types` names "sliding_attention" (Gemma 3; Qwen2/3
        with `use_sliding_window`); a config without layer types (Mistral) slides on every
        layer when it sets `sliding_window`."""
        model_type = getattr(config, "model_type", None)
        if model_type not in GATED_MLP_MODEL_TYPES:
            raise ValueError(
                f"model_type: got {model_type!r}; allowed: {', '.join(GATED_MLP_MODEL_TYPES)} "
                "(decoder-only models with a gated MLP, whose matrix products these counts know)"
            )
        heads, layers = config.num_attention_heads, config.num_hidden_layers
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None)
        sliding = layers if types is None else sum(t == "sliding_attention" for t in types)
        if not window or not sliding:
            window, sliding = None, 0
        return cls(config.hidden_size, layers, heads, kv_heads, head_dim,
                   config.intermediate_size, config.vocab_size, window, sliding)  # fmt: skip


@dataclass(frozen=True)
class Trainable:
    """Which weights of the matrix products get a gradient; the rest are frozen (`model.freeze`,
    or a LoRA model's base weights, whose adapters count here as trained layer weights)."""

    layer_weights: int  # trained weights of the L layers' matrix products (all: L x layer's)
    output_layer: bool  # whether the V x H output layer trains (not if tied to a frozen embedding)

    @classmethod
    def everything(cls, s: ModelShape) -> Trainable:
        """Full fine-tuning: every weight of every matrix product trains."""
        return cls(s.layers * layer_matmul_params(s), True)

    def weights(self, s: ModelShape) -> int:
        """Trained weights of the matrix products, the output layer's included."""
        return self.layer_weights + (s.hidden * s.vocab if self.output_layer else 0)


def layer_matmul_params(s: ModelShape) -> int:
    """Weights of one layer's matrix products: q (H x hd), k and v (H x kd each), o (hd x H),
    and the MLP's gate and up (H x I each) and down (I x H)."""
    attention = s.hidden * s.head_dim * (2 * s.heads + 2 * s.kv_heads)
    return attention + 3 * s.hidden * s.intermediate


def matmul_params(s: ModelShape) -> int:
    """Weights in every matrix product of a token's forward: L layers and the output layer
    (V x H; counted once whether or not it is tied to the embedding)."""
    return s.layers * layer_matmul_params(s) + s.hidden * s.vocab


def token_flops(s: ModelShape) -> int:
    """FLOPs of the L layers' matrix products for one token (attention scores aside)."""
    return 2 * s.layers * layer_matmul_params(s)


def output_layer_flops(s: ModelShape, rows: int) -> int:
    """FLOPs of `rows` rows of logits: (rows, H) @ (H, V)."""
    return 2 * s.hidden * s.vocab * rows


def context_sum(before: int, new: int, window: int | None = None) -> int:
    """Keys attended to by `new` tokens that follow `before` cached ones, causally:
    (before + 1) + (before + 2) + ... + (before + new), each term at most `window`."""
    if window is None:
        return new * before + new * (new + 1) // 2
    inside = max(0, min(before + new, window) - before)  # the tokens whose context fits W
    return context_sum(before, inside) + (new - inside) * window


def layer_keys(s: ModelShape, keys: int, window_keys: int | None = None) -> int:
    """(query, key) pairs summed over the L layers: `keys` on each full-attention layer,
    `window_keys` (the same pairs cut to the window; default `keys`) on each sliding one."""
    window_keys = keys if window_keys is None else window_keys
    return (s.layers - s.window_layers) * keys + s.window_layers * window_keys


def attention_flops(s: ModelShape, keys: int, window_keys: int | None = None) -> int:
    """FLOPs of QK^T and AV over (query, key) pairs in every layer and head (`layer_keys`):
    2 products x 2 d FLOPs per pair per head."""
    return 4 * s.heads * s.head_dim * layer_keys(s, keys, window_keys)


def _fed(s: ModelShape, prompt_len: int, completion_lens: Sequence[int]) -> tuple[int, int]:
    """A prompt run once and each completion run after it -> (tokens fed, attention FLOPs):
    the prompt's P tokens, then T_j - 1 tokens of completion j (its last token is never fed
    in: it scores nothing, and no token follows it)."""
    fed = [max(t - 1, 0) for t in completion_lens]
    keys = context_sum(0, prompt_len) + sum(context_sum(prompt_len, t) for t in fed)
    window_keys = context_sum(0, prompt_len, s.window) + sum(
        context_sum(prompt_len, t, s.window) for t in fed
    )
    return prompt_len + sum(fed), attention_flops(s, keys, window_keys)


def scoring_flops(s: ModelShape, prompt_len: int, completion_lens: Sequence[int]) -> int:
    """One forward scoring a group: a prompt of P tokens shared by completions of T_j tokens.
    Every completion token gets its row of logits (the prompt's last position scores the
    first one), sum_j T_j rows in all."""
    tokens, attention = _fed(s, prompt_len, completion_lens)
    return token_flops(s) * tokens + attention + output_layer_flops(s, sum(completion_lens))


def backward_flops(s: ModelShape, trainable: Trainable, prompt_len: int,
                   completion_lens: Sequence[int]) -> int:  # fmt: skip
    """The backward of `scoring_flops`' forward: every product's input gradient (dX = dY W^T,
    the forward's FLOPs again; attention's four, twice its two), and the weight gradients
    (dW = X^T dY) of the trained weights only: 2 per trained layer weight per token fed, and
    the output layer's per row of logits when it trains."""
    tokens, attention = _fed(s, prompt_len, completion_lens)
    rows = sum(completion_lens)
    inputs = token_flops(s) * tokens + output_layer_flops(s, rows) + 2 * attention
    output_weights = output_layer_flops(s, rows) if trainable.output_layer else 0
    return inputs + 2 * trainable.layer_weights * tokens + output_weights


def sampling_flops(s: ModelShape, prompt_len: int, completion_lens: Sequence[int]) -> int:
    """Decoding a group: the prompt prefilled once and its last row of logits drawn from
    (one row for the group), then T_j - 1 steps of one token for completion j, each with its
    row of logits: 1 + sum_j (T_j - 1) rows."""
    rows = 1 + sum(max(t - 1, 0) for t in completion_lens)
    tokens, attention = _fed(s, prompt_len, completion_lens)
    return token_flops(s) * tokens + attention + output_layer_flops(s, rows)


def decoding_bytes(s: ModelShape, prompt_lens: Sequence[int], completion_lens: Sequence[int],
                   weight_bytes: int, cache_bytes: int = 4) -> int:  # fmt: skip
    """Bytes one batch of N rows (prompt_lens, completion_lens: (N,)) reads while decoding
    together: every weight of the matrix products once per forward of the batch (the prefill,
    then one step per token of the longest completion but its last: max_j T_j forwards in all),
    and at each step every live row's cached keys and values (2 x k x d per position and
    layer, `cache_bytes` each: float32, as the lean engine keeps its cache), a sliding layer's
    within its window only."""
    if len(prompt_lens) != len(completion_lens):
        raise ValueError(f"decoding_bytes: {len(prompt_lens)} prompts, "
                         f"{len(completion_lens)} completions; allowed: one of each per row")  # fmt: skip
    forwards = max(completion_lens, default=0)
    weights = matmul_params(s) * weight_bytes * forwards
    rows = list(zip(prompt_lens, completion_lens, strict=True))
    keys = sum(context_sum(p, max(t - 1, 0)) for p, t in rows)
    window_keys = sum(context_sum(p, max(t - 1, 0), s.window) for p, t in rows)
    return weights + 2 * s.kv_heads * s.head_dim * cache_bytes * layer_keys(s, keys, window_keys)


def weight_pass_bytes(s: ModelShape, passes: int, element_bytes: int) -> int:
    """Bytes of reading every weight of the matrix products `passes` times: a scoring pass
    reads them once per micro-batch."""
    return matmul_params(s) * element_bytes * passes


def loss_pass_bytes(s: ModelShape, trainable: Trainable, passes: int, element_bytes: int) -> int:
    """Bytes of `passes` micro-batches with gradients: each reads every weight in its forward
    and again in its backward (the input gradients), and writes the gradients of the trained
    ones: 3 x the weights under full fine-tuning."""
    return (2 * matmul_params(s) + trainable.weights(s)) * element_bytes * passes


def adamw_bytes(params: int, element_bytes: int) -> int:
    """Bytes of one AdamW step over `params` weights: it reads each weight, its gradient and
    both moments, and writes the weight and both moments back (7 accesses)."""
    return 7 * params * element_bytes


def clip_bytes(params: int, element_bytes: int) -> int:
    """Bytes of clipping the gradient norm: one read for the norm, one read and one write to
    scale the gradients (3 accesses)."""
    return 3 * params * element_bytes


def limit_seconds(flops: float, nbytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    """The least time the work can take (the roofline): the larger of its compute at the peak
    rate and its memory traffic at the peak bandwidth."""
    if flops_per_s <= 0 or bytes_per_s <= 0:
        raise ValueError(f"limit_seconds: peaks must be > 0; got {flops_per_s} FLOP/s, "
                         f"{bytes_per_s} B/s")  # fmt: skip
    return max(flops / flops_per_s, nbytes / bytes_per_s)


def times_the_limit(measured_s: float, limit_s: float) -> float:
    """How many times the least time the measurement took: 1 is the hardware's limit, 4 means
    the phase ran at a quarter of it. NaN when there is no limit to compare with."""
    return measured_s / limit_s if limit_s > 0 else float("nan")
