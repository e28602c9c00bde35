"""Tests for grpo.lm.prompt_forms: chat messages as plain text, the plain stop, the form checks."""

import pytest
from tiny_models import build_tokenizer

from grpo.lm.prompt_forms import (
    PLAIN_STOP,
    check_chat_template,
    check_prompt_form,
    in_form,
    plain_text,
    stop_strings_for,
)

CONVERSATION = [
    {"role": "system", "content": "Add."},
    {"role": "user", "content": "1+1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+3?"},
]


def test_plain_text_is_question_and_answer_turns_after_the_system_paragraph():
    """Hand-written: the system turn as a paragraph, each exchange a Question/Answer pair
    followed by a blank line, then the last question and an open "Answer:"."""
    assert (
        plain_text(CONVERSATION) == "Add.\n\nQuestion: 1+1?\nAnswer: 2\n\nQuestion: 2+3?\nAnswer:"
    )
    assert plain_text([{"role": "user", "content": "f({})"}]) == "Question: f({})\nAnswer:"


def test_the_plain_stop_is_where_the_next_question_would_open():
    """A model continuing the plain text with another exchange writes PLAIN_STOP right after
    its answer (blank line or not)."""
    continued = plain_text([*CONVERSATION, {"role": "assistant", "content": "5"}, CONVERSATION[1]])
    answer = continued.removeprefix(plain_text(CONVERSATION))
    assert answer == " 5\n\nQuestion: 1+1?\nAnswer:"
    assert answer.index(PLAIN_STOP) == len(" 5\n")
    assert PLAIN_STOP in " 5\nQuestion: 7"


def test_a_role_without_a_plain_form_is_named():
    """A tool turn cannot be written as plain text: the error names the message and the role."""
    with pytest.raises(ValueError, match="message 1: role 'tool'"):
        plain_text([CONVERSATION[1], {"role": "tool", "content": "{}"}])


def test_in_form_changes_only_chat_messages_in_the_plain_form():
    """Plain: messages become plain_text, a str stays; chat: every prompt is returned as it is."""
    assert in_form(CONVERSATION, "plain") == plain_text(CONVERSATION)
    assert in_form("12+7=", "plain") == "12+7="
    assert in_form(CONVERSATION, "chat") is CONVERSATION


def test_the_plain_form_adds_its_stop_once_and_the_chat_form_none():
    """stop_strings_for appends PLAIN_STOP after the user's own stop strings, not twice (a
    resumed run's recorded config has it); the chat form leaves them as they are."""
    assert stop_strings_for("plain", ("\n\n",)) == ("\n\n", PLAIN_STOP)
    assert stop_strings_for("plain", ("\n\n", PLAIN_STOP)) == ("\n\n", PLAIN_STOP)
    assert stop_strings_for("chat", ("\n\n",)) == ("\n\n",)
    assert stop_strings_for("chat", ()) == ()


def test_an_unknown_form_is_refused_by_its_key():
    """A prompt form other than chat or plain is refused, naming the key and what is allowed."""
    with pytest.raises(
        ValueError, match="task.options.prompt_form: got 'text'; allowed: chat, plain"
    ):
        check_prompt_form("task.options.prompt_form", "text")


def test_chat_messages_need_a_chat_template_in_the_chat_form():
    """A base model's tokenizer (no chat template) with chat messages in the chat form: a
    ValueError naming the key and the plain form; str prompts, the plain form, or a tokenizer
    with a template pass."""
    base, chat = build_tokenizer(base=True), build_tokenizer()
    assert not base.chat_template and chat.chat_template
    with pytest.raises(ValueError, match="task.options.prompt_form: got chat.*allowed: plain"):
        check_chat_template("task.options.prompt_form", "chat", base, ["a", CONVERSATION])
    check_chat_template("task.options.prompt_form", "chat", base, ["a", "b"])
    check_chat_template("task.options.prompt_form", "plain", base, [CONVERSATION])
    check_chat_template("task.options.prompt_form", "chat", chat, [CONVERSATION])
