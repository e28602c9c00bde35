"""Token log-probs straight from the last hidden states, never holding (N, T, V) logits.

`selective_log_softmax` bounds the memory of the softmax, but its input, the
model's (N, T, V) logits, is itself the largest tensor of a long completion
over a large vocabulary (8 x 1024 x 152k fp32 logits are 5 GB). Here the
output layer is folded into the loss: rows of hidden states are multiplied by
the output weight one chunk at a time, and each chunk's logits are dropped as
soon as its log-softmax is taken.

    logprobs = output_layer_logprobs(hidden (..., H), weight (V, H), index (...))  # (...)
    logprobs, entropy = output_layer_logprobs_entropy(hidden, weight, index)  # one pass

Follows the same maths as `grpo.functional.logprobs` (picoRL's
`selective_log_softmax`; log p(i) = z_i - logsumexp(z)); the chunked
recomputation is the idea behind "cut cross-entropy" losses (Wijmans et al.
2024), done here with plain matmuls.

Departures from computing logits = hidden @ weight.T first:
- Backward recomputes each chunk's logits from the saved hidden states and
  weight (one extra (rows, H) x (H, V) matmul per chunk) instead of keeping
  any (N, T, V) tensor: peak extra memory is a few fp32 chunks of rows x V
  (`CHUNK_ROWS`). A weight that does not require a gradient (a frozen, tied
  embedding) gets none: no (V, H) gradient is allocated or accumulated.
- The softmax and everything after it are computed in fp32 (fp64 for fp64
  inputs) whatever the dtype of hidden and weight; gradients are returned in
  the inputs' dtypes. The products that read the weight (each chunk's logits,
  in forward and again in backward, and the hidden states' gradient) read
  `product_weight` when one is given: the weight in a lower dtype (bfloat16),
  which the caller casts once while the weight is unchanged
  (`grpo.precision.cast_once`). The rows are cast to its dtype and each chunk's
  logits widened to fp32 before the softmax, as autocast's bf16-mixed runs a
  model's own output layer and `selective_log_softmax` widens its logits. The
  weight's own gradient is summed in fp32 from the fp32 rows either way. With
  no `product_weight` the products run in fp32 from the weight itself (a
  caller's autocast is turned off inside, so it does not lower them), a
  lower-precision weight cast once per pass, not once per chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from grpo.functional._checks import check_positive
from grpo.functional.logprobs import _ENTROPY, _LOG_SOFTMAX, DEFAULT_CHUNK_ELEMENTS, _RowOp

__all__ = [
    "CHUNK_ROWS",
    "output_layer_entropy",
    "output_layer_logprobs",
    "output_layer_logprobs_entropy",
]

CHUNK_ROWS = 128
"""A chunk of rows (when `chunk_size` is None) is as many whole blocks of about
`DEFAULT_CHUNK_ELEMENTS` logits as fit in this many rows, and at least one block. The weight
is read once per chunk and pass, so over a large vocabulary, where a block is a few rows (16
over 262,144 tokens), several blocks a chunk read it that many times fewer (one block a chunk
made the layer bound by memory), for up to 128 MiB of fp32 logits a chunk. Where two blocks
do not fit (a block of more than CHUNK_ROWS / 2 rows: 85 over 49,152 tokens), a chunk is one
block. Several blocks a chunk equal one block a chunk to float rounding, not bit for bit: a
matrix-product kernel may round a row differently when the product holds more rows, and the
weight's gradient sums chunk by chunk."""


class _OutputLayer(torch.autograd.Function):
    """Per-row ops on softmax((hidden @ weight.T + bias) / temperature), chunk by chunk:
    each chunk's logits are computed once and serve every op in `ops`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, ops, step, temperature, product_weight):
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        rows = hidden.reshape(-1, hidden.shape[-1])  # (R, H)
        out = torch.empty(len(ops), rows.shape[0], dtype=dtype, device=hidden.device)  # (k, R)
        log_norm = torch.empty(rows.shape[0], dtype=dtype, device=hidden.device)  # (R,)
        cast = _product_weight(weight, product_weight, dtype)  # (V, H): what products read
        for start in range(0, rows.shape[0], step):
            part = slice(start, start + step)
            with _no_autocast(hidden):
                z = _logits(rows[part], cast, bias, dtype, temperature)  # (r, V)
            log_norm[part] = torch.logsumexp(z, dim=-1)
            for k, op in enumerate(ops):
                out[k, part] = op.forward(z, index[part], log_norm[part])
        # a cast made here is not kept for backward (one (V, H) copy per pending pass)
        ctx.save_for_backward(rows, weight, product_weight, bias, index, log_norm, out)
        ctx.ops, ctx.step = ops, step
        ctx.temperature, ctx.shape = temperature, hidden.shape
        ctx.set_materialize_grads(False)  # an output nothing depends on gets no backward work
        # copies: in-place edits of the results cannot reach the saved `out`
        return tuple(o.view(hidden.shape[:-1]).clone() for o in out)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outs):
        rows, weight, product_weight, bias, index, log_norm, out = ctx.saved_tensors
        used = [
            (op, out[k], g.reshape(-1).to(out.dtype))  # (R,) each
            for k, (op, g) in enumerate(zip(ctx.ops, grad_outs, strict=True))
            if g is not None
        ]
        if not used:
            return None, None, None, None, None, None, None, None
        grad_rows = torch.empty_like(rows)  # (R, H)
        # a frozen weight (or bias) gets no gradient, and costs no (V, H) product per chunk
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros(weight.shape, dtype=out.dtype, device=weight.device)  # (V, H)
        grad_bias = None
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = torch.zeros(bias.shape, dtype=out.dtype, device=bias.device)  # (V,)
        cast = _product_weight(weight, product_weight, out.dtype)  # (V, H), as in forward
        for start in range(0, rows.shape[0], ctx.step):
            part = slice(start, start + ctx.step)
            with _no_autocast(rows):
                z = _logits(rows[part], cast, bias, out.dtype, ctx.temperature)  # (r, V)
                grad_z = None  # (r, V): the ops' gradients summed in place
                for op, o, g in used:
                    grad = op.backward(z, index[part], log_norm[part], o[part], g[part])
                    grad_z = grad if grad_z is None else grad_z.add_(grad)
                if ctx.temperature != 1.0:
                    grad_z = grad_z.div_(ctx.temperature)  # chain rule through z = logits / T
                if grad_bias is not None:
                    grad_bias += grad_z.sum(0)
                if grad_weight is not None:  # (V, H), in place, from the fp32 grad_z
                    grad_weight.addmm_(grad_z.T, rows[part].to(out.dtype))
                grad_rows[part] = grad_z.to(cast.dtype) @ cast  # (r, H): no copy in fp32
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_rows.view(ctx.shape), grad_weight, grad_bias, None, None, None, None, None


def _product_weight(weight: Tensor, product_weight: Tensor | None, dtype) -> Tensor:
    """(V, H): `product_weight` when given, else `weight` in `dtype` (no copy in its own)."""
    return weight.to(dtype) if product_weight is None else product_weight


def _no_autocast(like: Tensor) -> torch.autocast:
    """Autocast off on `like`'s device: the matmuls run in the dtype asked for."""
    return torch.autocast(like.device.type, enabled=False)


def _logits(rows: Tensor, weight: Tensor, bias: Tensor | None, dtype, temperature) -> Tensor:
    """(r, H) rows, (V, H) weight in the products' dtype -> (r, V) logits / temperature in
    `dtype` (the rows cast to the weight's dtype, the product widened: no copies in fp32)."""
    z = (rows.to(weight.dtype) @ weight.T).to(dtype)  # (r, V)
    if bias is not None:
        z.add_(bias.to(dtype))  # in place: a (r, V) temporary fewer, the same numbers
    return z if temperature == 1.0 else z.div_(temperature)  # z / 1 is z: no pass for it


def _run(
    ops: tuple[_RowOp, ...],
    hidden,
    weight,
    index,
    bias,
    temperature,
    chunk_size,
    where=None,
    product_weight=None,
) -> tuple[Tensor, ...]:
    if not isinstance(hidden, Tensor) or not hidden.is_floating_point() or hidden.dim() < 1:
        raise ValueError("hidden: allowed: a floating-point tensor of shape (..., H)")
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight: got {got}; allowed: (V, H) with H = {hidden.shape[-1]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias: got {tuple(bias.shape)}; allowed: None or ({weight.shape[0]},)")
    temperature = check_positive(temperature, "temperature")
    if product_weight is not None and (
        not isinstance(product_weight, Tensor)
        or product_weight.shape != weight.shape
        or not product_weight.is_floating_point()
    ):
        got = tuple(product_weight.shape) if isinstance(product_weight, Tensor) else product_weight
        raise ValueError(
            f"product_weight: got {got!r}; allowed: None or a float tensor of the weight's "
            f"shape {tuple(weight.shape)}"
        )
    if chunk_size is not None:
        chunk_size = int(check_positive(chunk_size, "chunk_size"))
    block = max(1, DEFAULT_CHUNK_ELEMENTS // weight.shape[0])  # rows of about that many logits
    step = chunk_size or block * max(1, CHUNK_ROWS // block)
    if where is None:
        flat_index = index.reshape(-1).long()  # (R,)
        return _OutputLayer.apply(
            hidden, weight, bias, flat_index, ops, step, temperature, product_weight
        )
    if not isinstance(where, Tensor) or where.dtype != torch.bool or where.shape != index.shape:
        got = f"{tuple(where.shape)} {where.dtype}" if isinstance(where, Tensor) else where
        raise ValueError(f"where: got {got}; allowed: None or bool of shape {tuple(index.shape)}")
    picked = hidden[where], index[where].long()  # (R, H), (R,): the positions asked for only
    outs = _OutputLayer.apply(
        picked[0], weight, bias, picked[1], ops, step, temperature, product_weight
    )
    return tuple(o.new_zeros(where.shape).masked_scatter(where, o) for o in outs)  # (...) each


def _check_index(index: Tensor, hidden: Tensor, weight: Tensor) -> None:
    if tuple(index.shape) != tuple(hidden.shape[:-1]) or index.is_floating_point():
        raise ValueError(
            f"index: got {tuple(index.shape)} {index.dtype}; allowed: integer ids of shape "
            f"{tuple(hidden.shape[:-1])}"
        )
    if index.numel() and bool(((index < 0) | (index >= weight.shape[0])).any()):
        raise ValueError(f"index: token ids must lie in [0, V = {weight.shape[0]})")


def output_layer_logprobs(
    hidden: Tensor,
    weight: Tensor,
    index: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    where: Tensor | None = None,
    product_weight: Tensor | None = None,
) -> Tensor:
    """log softmax((hidden @ weight.T + bias) / temperature)[index]: (..., H), (V, H), (...) -> (...).

    Equal to `selective_log_softmax(hidden @ weight.T + bias, index, temperature=...)`
    without the logits tensor. `chunk_size` rows per chunk (None: whole blocks of about
    `DEFAULT_CHUNK_ELEMENTS` logits within `CHUNK_ROWS` rows). `where` (...) bool: compute
    at those positions only, 0 elsewhere (padding and prompt positions cost nothing).
    `product_weight` (V, H): the weight in the dtype its products run in (bfloat16), its
    gradient still going to `weight` (None: fp32 products; see the module docstring).
    Gradients flow to hidden, weight and bias.
    """
    _check_index(index, hidden, weight)
    ops = (_LOG_SOFTMAX,)
    (logprobs,) = _run(
        ops, hidden, weight, index, bias, temperature, chunk_size, where, product_weight
    )
    return logprobs


def output_layer_entropy(
    hidden: Tensor,
    weight: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    product_weight: Tensor | None = None,
) -> Tensor:
    """Entropy of softmax((hidden @ weight.T + bias) / temperature): (..., H), (V, H) -> (...)."""
    index = torch.zeros(hidden.shape[:-1], dtype=torch.long, device=hidden.device)  # unused
    (entropy,) = _run(
        (_ENTROPY,), hidden, weight, index, bias, temperature, chunk_size, None, product_weight
    )
    return entropy


def output_layer_logprobs_entropy(
    hidden: Tensor,
    weight: Tensor,
    index: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    where: Tensor | None = None,
    product_weight: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(`output_layer_logprobs`, `output_layer_entropy`) of the same arguments, each (...),
    from one computation of each chunk's logits instead of two (`where` as in
    `output_layer_logprobs`, for both). Backward does the work of the outputs a loss
    depends on only: an entropy kept as a metric costs no backward."""
    _check_index(index, hidden, weight)
    ops = (_LOG_SOFTMAX, _ENTROPY)
    return _run(ops, hidden, weight, index, bias, temperature, chunk_size, where, product_weight)
