"""Tests for grpo.rewards.format: tag and regex format rewards."""

import pytest

from grpo.rewards.format import regex_format_reward, tag_format_reward


def test_tag_format_exact_values():
    """Whole-completion R1 format: tags in order, once each, only whitespace around them."""
    reward = tag_format_reward(("think", "answer"), reward=1.0, penalty=-0.5)
    completions = [
        "<think>a</think>\n<answer>1</answer>",  # good
        "  <think>\na\n</think><answer>1</answer>\n",  # good, surrounding whitespace
        "<answer>1</answer><think>a</think>",  # wrong order
        "<think>a</think><answer>1</answer> trailing text",  # text outside the tags
        "<think><think>a</think><answer>1</answer>",  # nested/repeated opening tag
        "<answer>1</answer>",  # missing tag
    ]
    assert reward([""] * 6, completions) == [1.0, 1.0, -0.5, -0.5, -0.5, -0.5]


def test_tag_format_partial_credit():
    """partial=True pays a third of the reward per tag present exactly once (two tags) and
    the last third only for the whole format: wrong order or trailing text earn less."""
    reward = tag_format_reward(("think", "answer"), reward=3.0, penalty=-3.0, partial=True)
    completions = [
        "<answer>1</answer>",  # one tag: one share of 6 over 3
        "junk",  # none
        "<think></think><answer></answer>",  # the whole format
        "<answer>1</answer><think>a</think>",  # both tags, wrong order
        "<think>a</think><answer>1</answer> junk",  # both tags, text outside them
    ]
    assert reward([""] * 5, completions) == [-1.0, -3.0, 3.0, 1.0, 1.0]


def test_regex_format_is_a_full_match():
    """regex_format_reward requires the whole completion to match."""
    reward = regex_format_reward(r"M:( [a-h][1-8][a-h][1-8])+", reward=2.0, penalty=-1.0)
    assert reward(["", "", ""], ["M: e2e4 d2d4", "M: e2e4 x", "say M: e2e4"]) == [2.0, -1.0, -1.0]


def test_bad_configuration_is_rejected():
    """Empty tags, bad tag names and broken patterns raise ValueError."""
    with pytest.raises(ValueError, match="at least one"):
        tag_format_reward(())
    with pytest.raises(ValueError, match="plain tag"):
        tag_format_reward(("<think>",))
    with pytest.raises(ValueError, match="not a valid regular"):
        regex_format_reward("(")
