"""Assistant-token masks for multi-turn conversations, by incremental tokenisation.

The loss of a multi-turn episode counts the assistant's tokens only. picoRL
finds them by encoding ``messages[:1]``, ``messages[:2]``, ... with the chat
template and marking where each assistant message adds tokens. That is only
right when the template is *append-only*: rendering a longer conversation
must start with exactly the tokens of the shorter one. Templates that rewrite
earlier turns (dropping past reasoning, moving a system prompt, a tokenizer
merging characters across a message boundary) break it and silently shift the
mask onto the wrong tokens.

This module checks that property at every step and raises
`ChatTemplateError` naming the message whose rendering changed earlier tokens,
so a misaligned mask is never returned. Departures from picoRL:
- an assistant message's span starts after the template's generation prompt
  (``add_generation_prompt=True``), so role headers the model never sampled are
  not counted; the span ends where the template ends the message (end-of-turn
  tokens are counted: the model sampled them);
- when the sampled token ids of the assistant turns are given (token-in/token-out),
  they replace the template's re-tokenisation of those turns, so the sequence
  trained on holds exactly what was sampled even if re-tokenising the text
  would give other ids. What the template writes after a turn's end-of-turn token
  (Qwen's newline after ``<|im_end|>``) follows the sampled ids unmasked, as the
  next turn's prompt held it when that turn was sampled; after a turn known to be
  cut by the token limit (`action_truncated`), the whole closing does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from grpo.envs.base import EpisodeRollout, Message

__all__ = [
    "ChatTemplateError",
    "ChatTokens",
    "encode_chat",
    "rollout_tokens",
    "tokenize_with_assistant_mask",
]


class ChatTemplateError(ValueError):
    """The chat template is not append-only, so incremental masks would be misaligned."""


class ChatTokens(NamedTuple):
    """A tokenised conversation."""

    input_ids: list[int]  # (L,) the whole conversation
    assistant_mask: list[bool]  # (L,) True = a token of an assistant message (counted by the loss)


def encode_chat(
    tokenizer: Any, messages: Sequence[Message], *, add_generation_prompt: bool = False
) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template."""
    ids = tokenizer.apply_chat_template(
        list(messages),
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=False,
    )
    if hasattr(ids, "keys"):  # some versions return a BatchEncoding regardless
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _check_prefix(prefix: list[int], longer: list[int], index: int, what: str) -> None:
    if longer[: len(prefix)] == prefix:
        return
    position = next(
        (k for k, (a, b) in enumerate(zip(prefix, longer, strict=False)) if a != b),
        min(len(prefix), len(longer)),
    )
    raise ChatTemplateError(
        f"the chat template is not append-only at messages[{index}]: rendering {what} "
        f"changes the tokens of the conversation before it (first difference at token "
        f"{position}); an assistant mask built by incremental tokenisation would be "
        "misaligned. Use an append-only chat template (one that never rewrites earlier "
        "messages), or train on single-turn prompts."
    )


def tokenize_with_assistant_mask(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    action_token_ids: Sequence[Sequence[int]] | None = None,
    action_truncated: Sequence[bool] | None = None,
) -> ChatTokens:
    """Input ids of the conversation and the mask of its assistant tokens, checked for alignment.

    `action_token_ids`, when given, holds the sampled ids of each assistant message
    in order; they are used for those spans instead of the template's tokens.
    `action_truncated`, when known, says which of them the token limit cut: such a turn
    sampled no part of the template's closing, which then follows it whole.
    """
    messages = list(messages)
    if not messages or messages[0].get("role") == "assistant":
        raise ValueError("messages must be non-empty and start with a non-assistant message")
    num_assistant = sum(m.get("role") == "assistant" for m in messages)
    if action_token_ids is not None and len(action_token_ids) != num_assistant:
        raise ValueError(
            f"action_token_ids must hold one id list per assistant message, got "
            f"{len(action_token_ids)} for {num_assistant}"
        )
    if action_truncated is not None and (
        action_token_ids is None or len(action_truncated) != num_assistant
    ):
        raise ValueError(
            "action_truncated must hold one flag per assistant message, with "
            f"action_token_ids; got {len(action_truncated)} flags for {num_assistant} messages"
            + ("" if action_token_ids is not None else " and no action_token_ids")
        )
    input_ids: list[int] = []
    mask: list[bool] = []
    rendered: list[int] = []  # the template's tokens of messages[:i]
    turn = 0
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            header = encode_chat(tokenizer, messages[:i], add_generation_prompt=True)
            _check_prefix(rendered, header, i, f"the generation prompt after messages[:{i}]")
            input_ids += header[len(rendered) :]
            mask += [False] * (len(header) - len(rendered))
            full = encode_chat(tokenizer, messages[: i + 1])
            _check_prefix(header, full, i, f"messages[:{i + 1}]")
            if action_token_ids is None:
                span = full[len(header) :]
                input_ids += span
                mask += [True] * len(span)
            else:
                sampled = [int(t) for t in action_token_ids[turn]]  # what was actually sampled
                closing = _closing(tokenizer, messages[:i], header, full, i)
                cut = action_truncated is not None and action_truncated[turn]
                tail = closing[0 if cut else _overlap(sampled, closing) :]  # never sampled
                input_ids += sampled + tail
                mask += [True] * len(sampled) + [False] * len(tail)
            turn += 1
        else:
            full = encode_chat(tokenizer, messages[: i + 1])
            _check_prefix(rendered, full, i, f"messages[:{i + 1}]")
            input_ids += full[len(rendered) :]
            mask += [False] * (len(full) - len(rendered))
        rendered = full
    return ChatTokens(input_ids, mask)


def _closing(
    tokenizer: Any, before: list[Message], header: list[int], full: list[int], index: int
) -> list[int]:
    """The tokens the template closes an assistant turn with: its rendering of an empty one
    after the generation prompt `header` (``<|im_end|>`` and a newline, say), checked to end
    `full`, its rendering of the turn itself (a template that writes an empty turn otherwise,
    a reasoning block say, raises)."""
    empty = encode_chat(tokenizer, [*before, {"role": "assistant", "content": ""}])
    _check_prefix(header, empty, index, f"an empty assistant message at messages[{index}]")
    closing = empty[len(header) :]
    if full[len(full) - len(closing) :] != closing:
        raise ChatTemplateError(
            f"the chat template closes an empty assistant message at messages[{index}] with "
            "other tokens than it closes that message with, so the tokens after its sampled "
            "ids are not known; score these episodes turn by turn (scoring='turns')"
        )
    return closing


def _overlap(sampled: list[int], closing: list[int]) -> int:
    """The length of the longest end of `sampled` that begins `closing` (the end-of-turn
    token the model sampled itself); usually 0 for a turn the token limit cut short, which
    `action_truncated` makes sure of."""
    for k in range(min(len(sampled), len(closing)), 0, -1):
        if sampled[-k:] == closing[:k]:
            return k
    return 0


def rollout_tokens(
    tokenizer: Any, rollout: EpisodeRollout, *, use_sampled_ids: bool = True
) -> ChatTokens:
    """`tokenize_with_assistant_mask` of an episode, with its sampled ids when it has them."""
    ids = rollout.action_token_ids if use_sampled_ids else None
    cut = rollout.action_truncated if use_sampled_ids else None  # None: the agent gave none
    return tokenize_with_assistant_mask(
        tokenizer, rollout.messages, action_token_ids=ids, action_truncated=cut
    )
