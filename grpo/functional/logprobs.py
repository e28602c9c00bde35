"""Token log-probabilities and entropies from logits, without a full fp32 copy.

Follows picoRL ("Stolen: `selective_log_softmax`", "The Causal LM Shift")
and the chess loop (`logits[L-1:-1]` aligned with `targets[L:]`).

Departures from picoRL:
- picoRL computes `log_softmax` over the whole (N, T, V) tensor and gathers.
  Here rows are processed in chunks, each cast to fp32 on its own, using
  log p(i) = z_i - logsumexp(z). Peak extra memory is one fp32 chunk instead of
  a full fp32 (N, T, V) tensor, and bf16 logits are scored in fp32.
- A custom autograd function keeps only the per-row logsumexp for backward,
  recomputes each chunk's softmax there, and writes the gradient into one
  buffer in the logits' dtype: no fp32 (N, T, V) tensor in backward either.
- Temperature is applied per chunk after the fp32 cast, the same division
  by T that sampling applies to the logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from grpo.functional._checks import check_positive

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "selective_log_softmax",
    "completion_logprobs",
    "entropy_from_logits",
]

DEFAULT_CHUNK_ELEMENTS = 2**22
"""Rows per chunk when `chunk_size` is None: about this many logits (16 MiB in fp32)."""


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # bf16/fp16/fp32 are scored in fp32; fp64 stays fp64 (exact gradient checks use it)
    return torch.promote_types(dtype, torch.float32)


def _row_blocks(logits: Tensor, step: int) -> Iterator[tuple[int, Tensor]]:
    """(first row, block (R <= step, V)) views covering the rows of logits in order; no copies."""
    try:
        rows = logits.view(-1, logits.shape[-1])  # (R, V)
    except RuntimeError:
        # a strided slice such as logits[:, P-1:-1] cannot be flattened without copying
        # it; take one leading index at a time instead (each of those is a plain view)
        per_index = math.prod(logits.shape[1:-1])
        for i, sub in enumerate(logits.unbind(0)):
            for start, block in _row_blocks(sub, step):
                yield i * per_index + start, block
        return
    for start in range(0, rows.shape[0], step):
        yield start, rows[start : start + step]


def _gathered(z: Tensor, index: Tensor, log_norm: Tensor) -> Tensor:
    return z.gather(-1, index.unsqueeze(-1)).squeeze(-1) - log_norm  # log p = z_i - logsumexp(z)


def _gathered_grad(z, index, log_norm, out, grad_out):
    # d(z_i - logsumexp z)/dz = onehot(i) - softmax(z)
    grad = (z - log_norm.unsqueeze(-1)).exp_().mul_(-grad_out.unsqueeze(-1))  # (R, V)
    return grad.scatter_add_(-1, index.unsqueeze(-1), grad_out.unsqueeze(-1))


def _entropy(z: Tensor, index: Tensor, log_norm: Tensor) -> Tensor:
    probs = (z - log_norm.unsqueeze(-1)).exp_()  # (R, V)
    # p · z in place, in p; where z = -inf (a masked-out token) p is 0 and 0 · -inf is nan,
    # counted as the 0 it is: the only way p · z is not finite
    return log_norm - probs.mul_(z).nan_to_num_(nan=0.0).sum(-1)  # H = lse - E_p[z]


def _entropy_grad(z, index, log_norm, out, grad_out):
    # dH/dz_j = -p_j (z_j - E_p[z]), and E_p[z] = logsumexp(z) - H
    probs = (z - log_norm.unsqueeze(-1)).exp_()  # (R, V)
    centred = z - (log_norm - out).unsqueeze(-1)
    grad = torch.where(probs > 0, probs * centred, 0.0)
    return grad.mul_(-grad_out.unsqueeze(-1))


class _RowOp(NamedTuple):
    forward: Callable[[Tensor, Tensor, Tensor], Tensor]  # (z, index, log_norm) -> (R,)
    backward: Callable[..., Tensor]  # (z, index, log_norm, out, grad_out) -> dL/dz (R, V)


_LOG_SOFTMAX = _RowOp(_gathered, _gathered_grad)
_ENTROPY = _RowOp(_entropy, _entropy_grad)


class _Chunked(torch.autograd.Function):
    """A per-row op on softmax(logits / temperature), one fp32 row block at a time.

    Forward keeps only the per-row logsumexp; backward recomputes each block's
    softmax and writes its gradient into one buffer in the logits' dtype, so
    no full fp32 (..., V) tensor exists in either pass.
    """

    @staticmethod
    def forward(ctx, logits, index, op, step, temperature):
        dtype = _compute_dtype(logits.dtype)
        out = torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device).view(-1)  # (R,)
        log_norm = torch.empty_like(out)  # (R,)
        for start, block in _row_blocks(logits, step):
            rows = slice(start, start + block.shape[0])
            z = block.to(dtype) / temperature  # (R, V) fp32: the only full-width temporary
            log_norm[rows] = torch.logsumexp(z, dim=-1)
            out[rows] = op.forward(z, index[rows], log_norm[rows])
        ctx.save_for_backward(logits, index, log_norm, out)
        ctx.op, ctx.step, ctx.temperature = op, step, temperature
        # a copy, so that in-place edits of the result cannot corrupt the saved `out`
        return out.view(logits.shape[:-1]).clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        logits, index, log_norm, out = ctx.saved_tensors
        grad_out = grad_out.reshape(-1).to(out.dtype)  # (R,)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat_grad = grad.view(-1, logits.shape[-1])  # (R, V)
        for start, block in _row_blocks(logits, ctx.step):
            rows = slice(start, start + block.shape[0])
            z = block.to(out.dtype) / ctx.temperature  # (R, V)
            block_grad = ctx.op.backward(z, index[rows], log_norm[rows], out[rows], grad_out[rows])
            flat_grad[rows] = block_grad.div_(ctx.temperature)  # chain rule through z = logits / T
        return grad, None, None, None, None


def _run(op: _RowOp, logits: Tensor, index: Tensor, chunk_size: int | None, temperature: float):
    step = chunk_size or max(1, DEFAULT_CHUNK_ELEMENTS // logits.shape[-1])
    flat_index = index.reshape(-1).long()  # (R,) small, so copying it is fine
    return _Chunked.apply(logits, flat_index, op, step, temperature)


def _check_logits(logits: Tensor, chunk_size: int | None) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        got = type(logits).__name__ if not isinstance(logits, Tensor) else logits.dtype
        raise ValueError(f"logits: got {got}; allowed: a floating tensor of shape (..., V)")
    if logits.shape[-1] < 1:
        raise ValueError(f"logits: got shape {tuple(logits.shape)}; allowed: V >= 1")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size: got {chunk_size!r}; allowed: None or an int >= 1")


def selective_log_softmax(
    logits: Tensor, index: Tensor, chunk_size: int | None = None, *, temperature: float = 1.0
) -> Tensor:
    """log softmax(logits / temperature)[index] without a full fp32 log-prob tensor.

    logits (..., V) any float dtype, index (...) integer -> (...) in fp32
    (fp64 when logits are fp64). `chunk_size` is the number of rows (positions)
    per chunk; None picks about `DEFAULT_CHUNK_ELEMENTS` logits per chunk.
    Gradients flow to `logits`.
    """
    _check_logits(logits, chunk_size)
    temperature = check_positive(temperature, "temperature")
    if not isinstance(index, Tensor) or index.is_floating_point() or index.is_complex():
        got = type(index).__name__ if not isinstance(index, Tensor) else index.dtype
        raise ValueError(f"index: got {got}; allowed: an integer tensor of shape (...)")
    if tuple(index.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"index: shape {tuple(index.shape)} does not match logits {tuple(logits.shape)}"
            f" without its last dim, {tuple(logits.shape[:-1])}"
        )
    vocab = logits.shape[-1]
    if index.numel() and bool(((index < 0) | (index >= vocab)).any()):
        bad = index[(index < 0) | (index >= vocab)][0].item()
        raise ValueError(f"index: got token id {bad}; allowed: 0 <= id < V = {vocab}")
    return _run(_LOG_SOFTMAX, logits, index, chunk_size, temperature)


def completion_logprobs(
    logits: Tensor,
    completion_ids: Tensor,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
) -> Tensor:
    """Per-token log-probs of the completion: (N, P+T, V), (N, T) -> (N, T).

    `logits` come from one forward pass over prompt + completion, and
    `completion_ids` are the last T tokens of that input. A causal LM's logits
    at position t predict token t+1, so the completion tokens are scored by
    logits[:, -T-1:-1]; the last position predicts a token that was never fed
    in and is ignored. `logits` always means the full (N, P+T, V) output with
    P >= 1 (there is no variant that takes logits already cut to T positions).
    Logits are divided by `temperature` (> 0) in fp32, as sampling does.
    """
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits: got {got}; allowed: a tensor of shape (N, P+T, V)")
    if not isinstance(completion_ids, Tensor) or completion_ids.dim() != 2:
        got = (
            tuple(completion_ids.shape)
            if isinstance(completion_ids, Tensor)
            else type(completion_ids).__name__
        )
        raise ValueError(f"completion_ids: got {got}; allowed: a tensor of shape (N, T)")
    n, length, _ = logits.shape
    t = completion_ids.shape[1]
    if completion_ids.shape[0] != n or length < t + 1:
        raise ValueError(
            f"completion_ids: shape {tuple(completion_ids.shape)} does not fit logits "
            f"{tuple(logits.shape)}; allowed: (N, T) with the same N and T <= P+T-1"
        )
    scoring = logits[:, length - t - 1 : length - 1]  # (N, T, V) logits at t score token t+1
    return selective_log_softmax(scoring, completion_ids, chunk_size, temperature=temperature)


def entropy_from_logits(
    logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> Tensor:
    """Entropy of softmax(logits / temperature) at each position: (..., V) -> (...).

    H = logsumexp(z) - sum_i softmax(z)_i z_i, computed per row chunk in fp32
    (fp64 for fp64 logits). Gradients flow to `logits`.
    """
    _check_logits(logits, chunk_size)
    temperature = check_positive(temperature, "temperature")
    index = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)  # unused
    return _run(_ENTROPY, logits, index, chunk_size, temperature)
