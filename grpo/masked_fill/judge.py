"""A frozen judge model as the `RewardModel` of masked fill-in policies (the fill-in plan).

The fill-in plan rewards each fill with a frozen judge network's score of the whole
filled sequence (`calculate_judge_scores`). `TokenJudgeReward` wraps any torch
module mapping token ids (N, T) to one score per row, for example the
probability that a window is real text, so that `GRPOTrainer` can use it.

The judge is frozen once, at construction: eval mode, `requires_grad=False`,
and `train()` keeps it in eval mode, so nothing in a training loop can change
it. Scores are computed under `torch.no_grad()` in batches of `batch_size`. Sequences
of different lengths are padded with `pad_token_id`; the judge is told where the padding
is when it is a `transformers` model or its forward takes `attention_mask`.

Departure from the fill-in plan: the judge scores token ids directly (the fill's
own vocabulary) rather than decoded text, so a character-level judge needs
no tokenizer round trip; a text judge belongs in `grpo.rewards`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from grpo.masked_fill.policy import forward_padded, pad_rows

__all__ = ["TokenJudgeReward"]


def _squeeze_scores(output: Tensor) -> Tensor:
    """(N,) or (N, 1) judge output -> (N,) scores."""
    if output.dim() == 2 and output.shape[1] == 1:
        return output[:, 0]
    return output


class TokenJudgeReward:
    """`RewardModel`: reward_n = score(judge(action_n)) for filled id sequences."""

    def __init__(
        self,
        judge: nn.Module,
        *,
        pad_token_id: int = 0,
        batch_size: int = 256,
        score: Callable[[Tensor], Tensor] = _squeeze_scores,
    ) -> None:
        if not isinstance(judge, nn.Module):
            raise TypeError(f"judge must be a torch.nn.Module, got {type(judge).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is invalid: expected an int >= 1")
        self.judge = judge.eval().requires_grad_(False)
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.score = score
        """Maps the judge's raw output (or its `.logits`) for a batch to (batch,) rewards."""

    @property
    def device(self) -> torch.device:
        first = next(self.judge.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    @torch.no_grad()
    def score_sequences(self, sequences: Sequence[Any]) -> Tensor:
        """Judge scores of 1-D token-id sequences (padded to one length): (N,) fp32 on the CPU."""
        rows = [torch.as_tensor(s, dtype=torch.long) for s in sequences]
        if not rows:
            raise ValueError("sequences is empty: expected at least one token-id sequence")
        ids, attention = pad_rows(rows, self.pad_token_id)  # (N, T), (N, T) True = real token
        scores = []
        for start in range(0, len(rows), self.batch_size):
            batch = slice(start, start + self.batch_size)
            output = forward_padded(
                self.judge, ids[batch].to(self.device), attention[batch].to(self.device)
            )
            scores.append(self.score(getattr(output, "logits", output)).float().cpu())
        rewards = torch.cat(scores)  # (N,)
        if rewards.shape != (len(rows),):
            raise ValueError(
                f"judge scores have shape {tuple(rewards.shape)}: expected one per sequence, "
                f"({len(rows)},); pass score= to reduce the judge's output"
            )
        if not bool(torch.isfinite(rewards).all()):
            row = int((~torch.isfinite(rewards)).nonzero()[0])
            raise ValueError(
                f"judge score of sequence {row} is {rewards[row].item()}: expected finite"
            )
        return rewards

    def compute_rewards(self, states: list[Any], actions: list[Any]) -> Tensor:
        """Score each filled sequence; the state is not needed (the fill contains it): (N,)."""
        if len(states) != len(actions):
            raise ValueError(
                f"states and actions must be aligned: got {len(states)} states, {len(actions)} actions"
            )
        return self.score_sequences(actions)

    def to(self, device: Any) -> TokenJudgeReward:
        self.judge.to(device)
        return self

    def eval(self) -> TokenJudgeReward:
        self.judge.eval()
        return self

    def train(self, mode: bool = True) -> TokenJudgeReward:
        """The judge is frozen: it stays in eval mode whatever the trainer asks."""
        self.judge.eval()
        return self
