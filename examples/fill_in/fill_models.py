"""The two small networks of the fill-in example and their supervised training.

- The generator is a `transformers` BERT masked LM with a character
  vocabulary (no tokenizer, no download): bidirectional, so it can fill every
  masked position of a window in one step. It is pre-trained by masked-LM.
- The judge is a small convolutional classifier that outputs P(real) for a
  window; it learns to tell real windows from the pre-trained generator's
  fills, then stays frozen as the GRPO reward.

Both supervised loops use the training extras of seed 002: warm-up + cosine
learning rate, gradient clipping, and on a GPU mixed precision (bf16, or fp16
with a gradient scaler). On a CPU everything runs in fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn
from transformers import BertConfig, BertForMaskedLM, get_cosine_schedule_with_warmup

from fill_data import MASK, PAD

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_generator(vocab_size: int, window: int, width: int = 64, layers: int = 2) -> nn.Module:
    """A tiny BERT masked LM over characters; dropout off so sampling and scoring agree."""
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=width, num_hidden_layers=layers,
        num_attention_heads=4, intermediate_size=2 * width, max_position_embeddings=window,
        type_vocab_size=1, pad_token_id=PAD, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return BertForMaskedLM(config)


class CharJudge(nn.Module):
    """P(window is real text): embeddings -> two width-5 convolutions -> max-pool -> logit."""

    def __init__(self, vocab_size: int, width: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.conv1 = nn.Conv1d(width, width, 5, padding=2)
        self.conv2 = nn.Conv1d(width, width, 5, padding=2)
        self.head = nn.Linear(width, 1)

    def logit(self, ids: Tensor) -> Tensor:
        h = self.embed(ids).transpose(1, 2)  # (N, D, W)
        h = torch.relu(self.conv2(torch.relu(self.conv1(h))))  # (N, D, W)
        return self.head(h.amax(-1))[:, 0]  # (N,) max over positions: one bad spot suffices

    def forward(self, ids: Tensor) -> Tensor:
        return torch.sigmoid(self.logit(ids))  # (N,)


class Precision:
    """Autocast context and gradient scaler for one device (all off on a CPU)."""

    def __init__(self, name: str, device: torch.device) -> None:
        dtype = PRECISIONS[name]
        self.enabled = dtype is not None and device.type == "cuda"
        self.dtype = dtype
        self.device_type = device.type
        # fp16 gradients can underflow: scale the loss, unscale before clipping
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.enabled and dtype == torch.float16)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


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
        labels = windows.masked_fill(masked != MASK, -100)  # (n, W) -100 = ignored
        return model(input_ids=masked, labels=labels).loss

    return loss


def judge_loss(judge: CharJudge) -> Callable[[Tensor, Tensor], Tensor]:
    """Binary cross-entropy: label 1 for real windows, 0 for generated fills."""

    def loss(ids: Tensor, labels: Tensor) -> Tensor:
        return nn.functional.binary_cross_entropy_with_logits(judge.logit(ids).float(), labels)

    return loss
