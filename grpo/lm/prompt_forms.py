"""Prompt forms: chat messages through the tokenizer's chat template, or as plain text.

An instruction-tuned model reads chat messages through its tokenizer's chat
template, and its turn ends at an end-of-turn token (an EOS). A base model has
neither: the "plain" form writes the same messages as text for it to continue,

    <system content>

    Question: <user content>
    Answer: <assistant content>

    Question: <user content>
    Answer:

and generation ends at `PLAIN_STOP`, where the model starts the next question
(`stop_strings_for`). The completion keeps the stop string's tokens, as it keeps
an EOS: they are the sampled action that ended it; what the model wrote after
them is dropped before rewards and log-probs (`grpo.lm.sampling.split_completion`).
The labels are those of few-shot prompts for base models (GSM8K's "Question: ...
Answer: ..."). Only the standard library is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "PLAIN_OPEN",
    "PLAIN_STOP",
    "PLAIN_TURNS",
    "PROMPT_FORMS",
    "check_chat_template",
    "check_prompt_form",
    "in_form",
    "plain_text",
    "stop_strings_for",
]

PROMPT_FORMS = ("chat", "plain")
"""chat: messages through the tokenizer's chat template; plain: messages as `plain_text`."""
PLAIN_TURNS = {"system": "{}\n\n", "user": "Question: {}\n", "assistant": "Answer: {}\n\n"}
"""How the plain form writes each role's turn, its content in place of {}."""
PLAIN_OPEN = "Answer:"
"""What the plain form ends with: the answer the model writes (no space after it: the answer's
first token carries its own)."""
PLAIN_STOP = "\nQuestion:"
"""The plain form's stop string: a new line that opens the next question."""


def check_prompt_form(key: str, form: Any) -> str:
    """`form` if it is one of `PROMPT_FORMS`, else a ValueError naming `key`."""
    if form not in PROMPT_FORMS:
        raise ValueError(f"{key}: got {form!r}; allowed: {', '.join(PROMPT_FORMS)}")
    return form


def plain_text(messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages as plain text: each turn as `PLAIN_TURNS` writes it, then `PLAIN_OPEN`."""
    turns = []
    for i, message in enumerate(messages):
        if message["role"] not in PLAIN_TURNS:
            raise ValueError(
                f"message {i}: role {message['role']!r} has no plain form; allowed: "
                f"{', '.join(PLAIN_TURNS)}"
            )
        turns.append(PLAIN_TURNS[message["role"]].format(message["content"]))
    return "".join(turns) + PLAIN_OPEN


def in_form(prompt: Any, form: str) -> Any:
    """A prompt as `form` feeds it to the model: chat messages become `plain_text` in the plain
    form; a str prompt, and every prompt in the chat form, is returned as it is."""
    return plain_text(prompt) if form == "plain" and not isinstance(prompt, str) else prompt


def stop_strings_for(form: str, stop_strings: Sequence[str]) -> tuple[str, ...]:
    """`stop_strings` with `PLAIN_STOP` appended for the plain form (once: a run resumed from
    its recorded config already has it)."""
    stop = tuple(stop_strings)
    return (*stop, PLAIN_STOP) if form == "plain" and PLAIN_STOP not in stop else stop


def check_chat_template(key: str, form: str, tokenizer: Any, prompts: Iterable[Any]) -> None:
    """A ValueError naming `key` when the chat form meets chat messages and a tokenizer with
    no chat template (a base model), which could not render them."""
    if form != "chat" or getattr(tokenizer, "chat_template", None):
        return
    if any(not isinstance(prompt, str) for prompt in prompts):
        raise ValueError(
            f"{key}: got chat, but the model's tokenizer has no chat template (a base model) "
            "to render chat messages with; allowed: plain (the messages as 'Question: ... "
            "Answer:' text, generation ending at the next question)"
        )
