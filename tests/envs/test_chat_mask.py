"""Tests for grpo.envs.chat_mask: assistant masks by incremental tokenisation, checked."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpo.envs.base import EpisodeRollout
from grpo.envs.chat_mask import (
    ChatTemplateError,
    encode_chat,
    rollout_tokens,
    tokenize_with_assistant_mask,
)

WORDS = ["<pad>", "<eos>", "<user>", "<assistant>", "<end>", "guess", "a", "number", "higher",
         "lower", "correct", "8", "12", "11", "<system>", "play"]  # fmt: skip
VOCAB = {word: i for i, word in enumerate(WORDS)}
APPEND_ONLY = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
# Drops the content of every assistant message but the last: earlier turns get rewritten.
DROPS_PAST_TURNS = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}<assistant> <end> "
    "{% else %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "play"},
    {"role": "user", "content": "guess a number"},
    {"role": "assistant", "content": "8"},
    {"role": "user", "content": "higher"},
    {"role": "assistant", "content": "12"},
    {"role": "user", "content": "lower"},
]


def make_tokenizer(template: str) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel(VOCAB, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = template
    return tokenizer


def test_hand_checked_mask():
    """Ids and mask written by hand: only the assistant's content and <end> tokens are marked."""
    tokens = tokenize_with_assistant_mask(make_tokenizer(APPEND_ONLY), CONVERSATION)
    expected = [
        (14, False), (15, False), (4, False),  # <system> play <end>
        (2, False), (5, False), (6, False), (7, False), (4, False),  # <user> guess a number <end>
        (3, False), (11, True), (4, True),  # <assistant> header | 8 <end>
        (2, False), (8, False), (4, False),  # <user> higher <end>
        (3, False), (12, True), (4, True),  # <assistant> header | 12 <end>
        (2, False), (9, False), (4, False),  # <user> lower <end>
    ]  # fmt: skip
    assert tokens.input_ids == [t for t, _ in expected]
    assert tokens.assistant_mask == [m for _, m in expected]


def test_mask_matches_full_rendering():
    """The incremental ids equal one rendering of the whole conversation (append-only template)."""
    tokenizer = make_tokenizer(APPEND_ONLY)
    tokens = tokenize_with_assistant_mask(tokenizer, CONVERSATION)
    assert tokens.input_ids == tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=False
    )


def test_non_append_only_template_is_caught():
    """A template that rewrites past assistant turns raises, naming the first message that breaks it."""
    with pytest.raises(ChatTemplateError, match=r"messages\[3\]"):
        tokenize_with_assistant_mask(make_tokenizer(DROPS_PAST_TURNS), CONVERSATION)
    # A single assistant turn at the end is still fine under that template.
    tokens = tokenize_with_assistant_mask(make_tokenizer(DROPS_PAST_TURNS), CONVERSATION[:3])
    assert tokens.assistant_mask == [False] * 9 + [True, True]


def test_sampled_ids_replace_retokenisation():
    """Token-in/token-out: the sampled ids of each assistant turn are used as they are and
    masked; the template's closing <end>, which the model did not sample, follows unmasked."""
    sampled = [[11, 1], [13, 12, 1]]  # "8 <eos>", "11 12 <eos>": not what re-tokenising gives
    tokens = tokenize_with_assistant_mask(
        make_tokenizer(APPEND_ONLY), CONVERSATION, action_token_ids=sampled
    )
    assert tokens.input_ids[8:12] == [3, 11, 1, 4] and tokens.input_ids[15:20] == [3, 13, 12, 1, 4]
    assert tokens.assistant_mask == (
        [False] * 9 + [True, True] + [False] * 5 + [True] * 3 + [False] * 4
    )


# Writes a token after each message's <end>, as Qwen's template writes a newline after <|im_end|>.
TRAILING = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> <eos> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def test_template_tokens_after_the_sampled_end_of_turn_follow_unmasked():
    """What the template writes after the end-of-turn token the model sampled (<eos> here), and
    the whole closing of a turn cut short, are in the sequence, unmasked: the sequence equals
    the template's rendering of the conversation, so each later turn is scored in the context
    it was sampled in."""
    tokenizer = make_tokenizer(TRAILING)
    sampled = [[11, 4], [12]]  # "8 <end>" (ended by the model), "12" (cut at the token limit)
    tokens = tokenize_with_assistant_mask(tokenizer, CONVERSATION, action_token_ids=sampled)
    assert tokens.input_ids == tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=False
    )
    assert [t for t, m in zip(tokens.input_ids, tokens.assistant_mask, strict=True) if m] == [11, 4, 12]
    assert tokens.input_ids[10:12] == [3, 11] and tokens.assistant_mask[12:14] == [True, False]


def test_rollout_tokens_uses_the_episode_ids():
    """rollout_tokens feeds an episode's messages and sampled ids through the same check."""
    rollout = EpisodeRollout(
        messages=tuple(CONVERSATION[1:5]),
        rewards=(0.0, 1.0),
        actions=("8", "12"),
        action_token_ids=((11,), (12,)),
    )
    tokens = rollout_tokens(make_tokenizer(APPEND_ONLY), rollout)
    assert tokens.input_ids == [2, 5, 6, 7, 4, 3, 11, 4, 2, 8, 4, 3, 12, 4]
    assert [t for t, m in zip(tokens.input_ids, tokens.assistant_mask, strict=True) if m] == [11, 12]


def test_bad_inputs():
    """Conversations must start with a non-assistant message; one id list per assistant turn."""
    tokenizer = make_tokenizer(APPEND_ONLY)
    with pytest.raises(ValueError, match="start with"):
        tokenize_with_assistant_mask(tokenizer, CONVERSATION[2:])
    with pytest.raises(ValueError, match="one id list per assistant"):
        tokenize_with_assistant_mask(tokenizer, CONVERSATION, action_token_ids=[[1]])


# The closing starts with an ordinary word, which a turn cut short can end with too.
CLOSED_BY_A_WORD = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} play <end> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def test_a_turn_known_to_be_cut_gets_the_whole_closing():
    """A turn the token limit cut that happens to end with the closing's first word sampled
    none of the closing: with its truncation flag, the whole closing follows it, as the
    template renders the conversation; without the flag the word is taken for the model's."""
    tokenizer = make_tokenizer(CLOSED_BY_A_WORD)
    conversation = [*CONVERSATION[1:2], {"role": "assistant", "content": "8 play"}]
    sampled = [[11, 15]]  # "8 play", cut at the token limit
    known = tokenize_with_assistant_mask(
        tokenizer, conversation, action_token_ids=sampled, action_truncated=[True]
    )
    assert known.input_ids == encode_chat(tokenizer, conversation)
    assert known.input_ids[-4:] == [11, 15, 15, 4] and known.assistant_mask[-4:] == [
        True, True, False, False]  # fmt: skip
    unknown = tokenize_with_assistant_mask(tokenizer, conversation, action_token_ids=sampled)
    assert unknown.input_ids[-3:] == [11, 15, 4]


def test_truncation_flags_must_match_the_turns():
    """One truncation flag per assistant message, and only beside the sampled ids."""
    tokenizer = make_tokenizer(APPEND_ONLY)
    with pytest.raises(ValueError, match="one flag per assistant message.*got 1 flags for 2"):
        tokenize_with_assistant_mask(
            tokenizer, CONVERSATION, action_token_ids=[[11], [12]], action_truncated=[True]
        )
    with pytest.raises(ValueError, match="and no action_token_ids"):
        tokenize_with_assistant_mask(tokenizer, CONVERSATION, action_truncated=[True, False])
