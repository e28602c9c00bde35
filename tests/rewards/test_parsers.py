"""Tests for grpo.rewards.parsers: picoRL's parser composition."""

import pytest

from grpo.rewards.parsers import (
    ParseResult,
    completion_text,
    compose_parsers,
    parser_reward,
    regex_parser,
    strip_parser,
    tag_parser,
)


def _recording(name, calls, result):
    def parser(action):
        calls.append((name, action))
        return result(action)

    return parser


def test_each_parser_sees_the_previous_action_and_rewards_add_up():
    """Parsers run in order on the previous action; rewards accumulate; obs of successes dropped."""
    calls = []
    first = _recording("first", calls, lambda a: ParseResult(a.upper(), 0.25, "ignored"))
    second = _recording("second", calls, lambda a: ParseResult(a + "!", 0.5))
    result = compose_parsers(first, second)("ok")
    assert calls == [("first", "ok"), ("second", "OK")]
    assert result == ParseResult("OK!", 0.75, None)


def test_first_failure_short_circuits_and_keeps_its_obs():
    """A failing parser stops the chain: later parsers never run; reward so far + its penalty."""
    calls = []
    first = _recording("first", calls, lambda a: ParseResult(a, 0.5))
    failing = _recording("failing", calls, lambda a: ParseResult(None, -1.0, "bad format"))
    never = _recording("never", calls, lambda a: ParseResult(a, 100.0))
    result = compose_parsers(first, failing, never)("x")
    assert [name for name, _ in calls] == ["first", "failing"]
    assert result == ParseResult(None, -0.5, "bad format")


def test_tag_then_int_parsers_compose():
    """<answer> extraction then integer conversion: success, missing tag, non-integer answer."""

    def to_int(text):
        try:
            return ParseResult(int(text), 1.0)
        except ValueError:
            return ParseResult(None, -0.5, "not an integer")

    parse = compose_parsers(tag_parser("answer", reward=0.1, penalty=-1.0), to_int)
    assert parse("think <answer> 42 </answer>") == ParseResult(42, 1.1, None)
    assert parse("no tags").action is None and parse("no tags").reward == -1.0
    assert parse("<answer>x</answer>") == ParseResult(None, pytest.approx(-0.4), "not an integer")


def test_tag_parser_takes_the_last_block():
    """With several <answer> blocks the last one is the answer."""
    assert tag_parser("answer")("<answer>1</answer> <answer>2</answer>").action == "2"


def test_regex_and_strip_parsers():
    """regex_parser returns the group; strip_parser fails on blank text."""
    assert regex_parser(r"= (\d+)", group=1)("x = 17").action == "17"
    assert regex_parser(r"\d+", penalty=-2.0)("none") == ParseResult(
        None, -2.0, "The answer must match '\\\\d+'."
    )
    assert strip_parser("  a ") == ParseResult("a", 0.0, None)
    assert strip_parser("   ").action is None


def test_parser_reward_follows_the_reward_contract():
    """parser_reward gives the accumulated reward per completion, chat messages included."""
    reward = parser_reward(compose_parsers(tag_parser("answer", reward=1.0, penalty=-1.0)))
    completions = [
        "<answer>3</answer>",
        "3",
        [{"role": "assistant", "content": "<answer>4</answer>"}],
    ]
    assert reward(["p"] * 3, completions) == [1.0, -1.0, 1.0]


def test_bad_arguments_are_named():
    """No parsers, non-callables, bad tags and non-text completions raise clear errors."""
    with pytest.raises(ValueError, match="at least one"):
        compose_parsers()
    with pytest.raises(TypeError, match=r"parsers\[1\]"):
        compose_parsers(strip_parser, "nope")
    with pytest.raises(ValueError, match="^tag must be a plain tag name"):
        tag_parser("a b")
    with pytest.raises(TypeError, match=r"completions\[2\]"):
        completion_text(3, 2)
