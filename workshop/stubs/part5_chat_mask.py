"""Part 5: the assistant-token mask of a conversation, by incremental tokenisation.

In a multi-turn episode the loss counts only the tokens the model sampled: the
assistant's. Chat templates differ in how they wrap messages, so instead of
parsing the template, picoRL renders the conversation one message longer at
a time and looks at which tokens each message added:

    ids of messages[:1], messages[:2], ...   ->   message i owns the new tail

Two refinements the library's tests ask for:
- the role header in front of an assistant message (what the template adds
  with `add_generation_prompt=True`) was not sampled: it is not counted. The
  assistant's span starts after the generation prompt and ends where the
  template ends the message (end-of-turn tokens are counted: they were sampled);
- this only works if the template is *append-only*: rendering a longer
  conversation must start with exactly the tokens of the shorter one. Check it
  at every step and raise `ChatTemplateError` naming `messages[i]`, the first
  message whose rendering changed earlier tokens: a silently shifted mask trains
  on the wrong tokens.

Check: python -m workshop.check --part 5
Library version: grpo/envs/chat_mask.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpo.envs.base import Message
from grpo.envs.chat_mask import ChatTemplateError, ChatTokens, encode_chat

__all__ = ["ChatTemplateError", "ChatTokens", "encode_chat", "tokenize_with_assistant_mask"]


def tokenize_with_assistant_mask(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    action_token_ids: Sequence[Sequence[int]] | None = None,
    action_truncated: Sequence[bool] | None = None,
) -> ChatTokens:
    """Input ids of the conversation and the mask of its assistant tokens: ChatTokens(ids, mask).

    tokenizer         has a chat template; `encode_chat(tokenizer, messages,
                      add_generation_prompt=False)` returns its token ids as a list[int]
    messages          [{"role": ..., "content": ...}, ...], not starting with an assistant
    action_token_ids  optional, one id list per assistant message, in order: the ids the
                      model actually sampled. Use them for the assistant spans instead of
                      the template's tokens (re-tokenising text can give other ids), then
                      the template's closing tokens the model did not sample (False).
    action_truncated  optional, one flag per assistant message: the token limit cut it, so
                      its ids hold no part of the closing (the whole closing follows them).
    returns           ChatTokens(input_ids: list[int] (L,), assistant_mask: list[bool] (L,))

    Hints, for message i (keep `rendered` = the ids of messages[:i]):
    - not an assistant: full = encode_chat(tokenizer, messages[:i+1]); it adds
      full[len(rendered):], all False.
    - an assistant: header = encode_chat(tokenizer, messages[:i], add_generation_prompt=True)
      adds header[len(rendered):] (False); then full = encode_chat(tokenizer, messages[:i+1])
      adds full[len(header):] (True); or, with sampled ids, those ids (True) and then
      the closing the template writes after a turn that the ids do not end with (False):
      closing = encode_chat(tokenizer, messages[:i] + [an assistant message with content
      ""])[len(header):]; drop from its front the longest run the sampled ids end with
      (their own end-of-turn token; nothing for a turn action_truncated says was cut),
      and check that full ends with closing.
    - before each slice, check that the shorter list is a prefix of the longer one;
      if not, raise ChatTemplateError(f"... messages[{i}] ...").
    """
    raise NotImplementedError("part 5: write tokenize_with_assistant_mask")
