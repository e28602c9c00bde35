"""The two small networks of the fill-in example and their supervised training.

- The generator is a tiny bidirectional character transformer (a user's
  module: ids in, logits out), so it can fill every masked position of a
  window in one step. It is pre-trained by masked-LM.
- The judge is a small convolutional classifier that outputs P(real) for a
  window; it learns to tell real windows from the pre-trained generator's
  fills, then stays frozen as the GRPO reward.

Both supervised loops use the training extras of the fill-in plan: warm-up + cosine
learning rate, gradient clipping, and the run's precision (`policy.precision`:
fp32, bf16-mixed, or fp16-mixed with a gradient scaler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
from fill_data import MASK, PAD
from torch import Tensor, nn
from transformers import get_cosine_schedule_with_warmup

from grpo.precision import PRECISIONS, compute_precision


class CharFillTransformer(nn.Module):
    """Bidirectional character fill-in model: ids (N, W) -> logits (N, W, V).

    A width-5 convolution mixes each character with its neighbours before the
    (pre-LayerNorm) transformer layers: on a few KB of text a plain character
    transformer spends its first thousand steps at the unigram plateau, the
    convolution gives it local context from the first step.
    """

    def __init__(self, vocab_size: int, window: int, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Parameter(0.02 * torch.randn(window, width))
        self.conv = nn.Conv1d(width, width, 5, padding=2)
        layer = nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=2 * width, dropout=0.0,  # no dropout: sampling = scoring
            batch_first=True, norm_first=True,
        )  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.embed(ids) + self.position[: ids.shape[1]]  # (N, W, D)
        h = h + torch.relu(self.conv(h.transpose(1, 2))).transpose(1, 2)  # (N, W, D)
        return self.head(self.norm(self.encoder(h)))  # (N, W, V)


class CharJudge(nn.Module):
    """P(window is real text): embeddings -> two width-5 convolutions -> mean-pooled logit."""

    def __init__(self, vocab_size: int, width: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.conv1 = nn.Conv1d(width, width, 5, padding=2)
        self.conv2 = nn.Conv1d(width, width, 5, padding=2)
        self.head = nn.Linear(width, 1)

    def logit(self, ids: Tensor) -> Tensor:
        h = self.embed(ids).transpose(1, 2)  # (N, D, W)
        h = torch.relu(self.conv2(torch.relu(self.conv1(h))))  # (N, D, W)
        # Mean over positions: each character's evidence adds up, so the score moves
        # smoothly with every improved fill (a max-pool is set by the single worst spot).
        return self.head(h.transpose(1, 2)).mean(dim=(1, 2))  # (N,)

    def forward(self, ids: Tensor) -> Tensor:
        return torch.sigmoid(self.logit(ids))  # (N,)


class Precision:
    """Autocast context and gradient scaler of a `grpo.precision` name on one device."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.name = name
        self.enabled = PRECISIONS[name] is not None
        self.device_type = device.type
        # fp16 gradients can underflow: scale the loss, unscale before clipping
        fp16 = PRECISIONS[name] == torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=fp16)

    def autocast(self) -> AbstractContextManager:
        return compute_precision(self.name, self.device_type)


def fit(
    model: nn.Module,
    batches: Iterator[tuple[Tensor, ...]],
    loss_fn: Callable[..., Tensor],
    steps: int,
    lr: float,
    precision: Precision,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """AdamW with warm-up + cosine decay, clipping and optional AMP; returns the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, max(1, steps // 10), steps)
    model.train()
    losses = []
    for _ in range(steps):
        with precision.autocast():
            loss = loss_fn(*next(batches))
        precision.scaler.scale(loss).backward()
        precision.scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        precision.scaler.step(optimizer)
        precision.scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return losses


def masked_lm_loss(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """Cross-entropy of the true characters at masked positions only."""

    def loss(masked: Tensor, windows: Tensor) -> Tensor:
        is_masked = masked == MASK  # (n, W)
        logits = model(masked)[is_masked].float()  # (M, V)
        return nn.functional.cross_entropy(logits, windows[is_masked])

    return loss


def judge_loss(judge: CharJudge) -> Callable[[Tensor, Tensor], Tensor]:
    """Binary cross-entropy: label 1 for real windows, 0 for generated fills."""

    def loss(ids: Tensor, labels: Tensor) -> Tensor:
        return nn.functional.binary_cross_entropy_with_logits(judge.logit(ids).float(), labels)

    return loss
