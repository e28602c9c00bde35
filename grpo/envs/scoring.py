"""Whole-conversation log-probs of the assistant tokens (picoRL's multi-turn loss input).

One forward pass per conversation: the input is the whole tokenised
conversation (`grpo.envs.chat_mask`), the log-prob of token t + 1 comes from
the logits at t (`grpo.functional.completion_logprobs`), and the mask is the
assistant mask shifted by one, as picoRL notes (``mask[1:]``, not ``mask[:-1]``).
With a large vocabulary the output layer is folded into the log-softmax
(`grpo.lm.folding`, as in `grpo.lm.scoring`), so no (N, L, V) logits exist.

This is the cheap way to score an episode and the only one when the sampled
token ids are unknown (a text-only inference engine). It is exact when the
conversation the model sees at each turn is a prefix of the final one, which
`tokenize_with_assistant_mask` checks for the template's own rendering; when
the agent kept its sampled ids and the template ends a turn with a token other
than the sampled EOS, `grpo.envs.agent.EpisodePolicy` (per-turn scoring) is the
exact alternative.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from grpo.envs.chat_mask import ChatTokens
from grpo.functional.logprobs import completion_logprobs
from grpo.functional.output_layer import output_layer_logprobs
from grpo.lm.folding import folded_output_layer
from grpo.precision import cast_once, compute_dtype, compute_precision
from grpo.protocols import TokenLogProbs

__all__ = ["conversation_logprobs"]


def conversation_logprobs(
    model: nn.Module,
    conversations: Sequence[ChatTokens],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    chunked_output_layer: bool | str = "auto",
    precision: str = "fp32",
) -> TokenLogProbs:
    """Log-probs (N, L-1) of each conversation's tokens 1..L-1; mask = assistant tokens.

    Conversations are right-padded to the longest length L; padded and
    non-assistant positions have log-prob 0 and mask False. `chunked_output_layer`:
    whether to fold the output layer into the log-softmax (`grpo.lm.folding`). The
    forward computes in `precision` (`grpo.precision`), the log-softmax in float32.
    """
    if not conversations:
        raise ValueError("conversations must hold at least one tokenised conversation")
    for n, tokens in enumerate(conversations):
        if len(tokens.input_ids) != len(tokens.assistant_mask) or len(tokens.input_ids) < 2:
            raise ValueError(
                f"conversations[{n}] must have input_ids and assistant_mask of one length >= 2, "
                f"got {len(tokens.input_ids)} and {len(tokens.assistant_mask)}"
            )
    device = next(model.parameters()).device
    L = max(len(tokens.input_ids) for tokens in conversations)
    input_ids = torch.full((len(conversations), L), pad_token_id, dtype=torch.long)  # (N, L)
    present = torch.zeros((len(conversations), L), dtype=torch.long)  # (N, L) 1 = real token
    assistant = torch.zeros((len(conversations), L), dtype=torch.bool)  # (N, L)
    for n, tokens in enumerate(conversations):
        length = len(tokens.input_ids)
        input_ids[n, :length] = torch.tensor(tokens.input_ids, dtype=torch.long)
        present[n, :length] = 1
        assistant[n, :length] = torch.tensor(tokens.assistant_mask, dtype=torch.bool)
    input_ids, present, assistant = input_ids.to(device), present.to(device), assistant.to(device)
    # Right padding only: real tokens keep positions 0..length-1 without explicit position ids.
    inputs = {"input_ids": input_ids, "attention_mask": present}
    folded = folded_output_layer(model, chunked_output_layer, inputs)
    # Position t holds log p(token t+1 | tokens <= t): the mask moves with the target token.
    mask = assistant[:, 1:] & present[:, 1:].bool()  # (N, L-1)
    with compute_precision(precision, input_ids.device.type):
        if folded is None:
            logits = _logits(model(**inputs, use_cache=False))  # (N, L, V)
        else:  # no (N, L, V) logits: the output layer folded into the log-softmax
            body, head = folded
            hidden = body(**inputs, use_cache=False).last_hidden_state[:, :-1]  # (N, L-1, H)
            product = compute_dtype(head.weight.dtype, input_ids.device.type)
            at = {"bias": head.bias, "temperature": temperature, "where": mask,
                  "product_weight": cast_once(head.weight, product)}  # fmt: skip
            # (N, L-1), at assistant tokens only: products in the precision's dtype, softmax fp32
            logprobs = output_layer_logprobs(hidden, head.weight, input_ids[:, 1:], **at)
    if folded is None:
        logprobs = completion_logprobs(logits, input_ids[:, 1:], temperature)  # (N, L-1) float32
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))  # no gradient elsewhere
    return TokenLogProbs(logprobs, mask)


def _logits(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output
