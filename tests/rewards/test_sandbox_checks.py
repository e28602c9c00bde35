"""Tests for the sandbox's verdicts (grpo/rewards/_sandbox_checks.py and the child's encoder).

The expected side of an `assert X == literal` test never reaches the child, and
values are compared by the parent on plain data that the child read without
calling any of the value's methods: lying objects fail, honest ones keep the
verdict Python's own assert gives.
"""

import json
import math
from collections import Counter, OrderedDict, namedtuple
from enum import IntEnum

import pytest

from grpo.rewards._sandbox_asserts import _make_encoder
from grpo.rewards._sandbox_checks import Opaque, decode, parse_check
from grpo.rewards.sandbox import run_code
from tests.rewards.forging import CONFIG


def _assert_forging_fails(code, tests=("assert add(1, 2) == 3",)):
    result = run_code(code, asserts=list(tests), config=CONFIG)
    assert (result.passed, result.score) == (0, 0.0), result


def _round_trip(value):
    return decode(json.loads(_make_encoder()(value)))


@pytest.mark.parametrize(
    "test, sent, held",
    [
        ("assert add(1, 2) == 3", [("eval", "add(1, 2)")], 3),
        ("assert 'x' == f(a='y')", [("eval", "f(a='y')")], "x"),
        ("assert not f() != {1: (2, 3)}", [("eval", "f()")], {1: (2, 3)}),
        ("assert f() is None", [("eval", "f()")], None),
        ("assert f(x) == g(y)", [("eval", "f(x)"), ("eval", "g(y)")], None),
        ("assert is_even(4)", [("eval", "is_even(4)")], None),
        ("x = f()\nassert x == 3", [("exec", "x = f()\nassert x == 3")], None),
        ("assert 1 < f() < 3", [("eval", "1 < f() < 3")], None),
        ("assert f() is g()", [("exec", "assert f() is g()")], None),
    ],
)
def test_the_literal_side_stays_in_the_parent(test, sent, held):
    """Only the non-literal side(s) of a comparison go to the child; the literal is held here."""
    check = parse_check(test)
    assert [list(step) for step in check.steps] == [list(step) for step in sent]
    assert check.literal == held


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -7, 2**70, 1.5, -0.0, "é\n\"", b"\x00", bytearray(b"ab"), 1 + 2j, [1, [2]],
     (1, (2,)), {"a": [1], 2: None, (1, 2): {3}}, {1, 2}, frozenset({3}), math.inf, -math.inf],
)  # fmt: skip
def test_plain_values_survive_the_round_trip(value):
    """Built-in data read by the child's encoder decodes to an equal value of the same type."""
    decoded = _round_trip(value)
    assert decoded == value and type(decoded) is type(value)


def test_subclasses_read_as_their_stored_builtin_value():
    """Counter, namedtuple, IntEnum, OrderedDict and lying subclasses decode to their base data."""
    point = namedtuple("Point", "x y")
    lying = type("Lying", (int,), {"__eq__": lambda s, o: True, "__hash__": int.__hash__})
    lying_list = type(
        "LyingList", (list,), {"__iter__": lambda s: iter([9]), "__eq__": lambda s, o: True}
    )
    level = IntEnum("Level", "LOW HIGH")
    assert _round_trip(Counter("aab")) == {"a": 2, "b": 1}
    assert _round_trip(point(1, 2)) == (1, 2) and type(_round_trip(point(1, 2))) is tuple
    assert _round_trip(level.HIGH) == 2 and type(_round_trip(level.HIGH)) is int
    assert _round_trip(OrderedDict(b=1, a=2)) == {"a": 2, "b": 1}
    assert _round_trip(lying(5)) == 5 and _round_trip(lying(5)) != 4
    assert _round_trip(lying_list([1, 2])) == [1, 2]
    assert math.isnan(_round_trip(math.nan))


def test_other_objects_are_opaque():
    """An object of another class reads as opaque: not None, equal to nothing, truthy if plain."""
    plain = _round_trip(type("Node", (), {})())
    sized = _round_trip(type("Sized", (), {"__len__": lambda s: 0})())
    assert isinstance(plain, Opaque) and plain.truthy is True and sized.truthy is None
    cycle = []
    cycle.append(cycle)  # too deep to read: unreadable as a whole
    unreadable = _round_trip(cycle)
    assert isinstance(unreadable, Opaque) and unreadable.truthy is None


def test_opaque_values_decide_only_identity_and_plain_truth():
    """Comparisons with an opaque value fail either way; `is None` and default truthiness hold."""
    node, sized = Opaque(truthy=True), Opaque(truthy=None)
    assert parse_check("assert f() is not None").passes([node])
    assert parse_check("assert f()").passes([node])
    assert not parse_check("assert not f()").passes([node])
    assert not parse_check("assert f()").passes([sized])
    assert not parse_check("assert not f()").passes([sized])
    assert not parse_check("assert f() == 3").passes([node])
    assert not parse_check("assert not f() == 3").passes([node])  # undecided, not "not equal"
    assert not parse_check("assert f() < 'a'").passes([1])  # Python's assert would raise
    assert not parse_check("assert not f() < 'a'").passes([1])


def test_reading_the_expected_value_from_the_caller_does_not_pass():
    """A function that returns the literal its test expects (read from the caller) still fails."""
    attack = (
        "import ast, sys\n"
        "def add(a, b):\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        texts = [v for v in frame.f_locals.values() if isinstance(v, str)]\n"
        "        texts += [c for c in frame.f_code.co_consts if isinstance(c, str)]\n"
        "        for text in texts:\n"
        "            if text.startswith('assert') and '==' in text:\n"
        "                return ast.literal_eval(text.rsplit('==', 1)[1].strip())\n"
        "        frame = frame.f_back\n"
        "    return a - b\n"
    )
    _assert_forging_fails(attack)


@pytest.mark.parametrize(
    "returned, test",
    [
        (
            "type('E', (), {'__eq__': lambda s, o: True, '__hash__': None})()",
            "assert add(1, 2) == 3",
        ),
        ("type('N', (), {'__ne__': lambda s, o: False})()", "assert not add(1, 2) != 3"),
        (
            "type('I', (int,), {'__eq__': lambda s, o: True, '__hash__': None})(0)",
            "assert add(1, 2) == 3",
        ),
        (
            "type('S', (str,), {'__eq__': lambda s, o: True, '__hash__': None})('')",
            "assert add(1, 2) == 'x'",
        ),
        ("type('L', (list,), {'__eq__': lambda s, o: True})()", "assert add(1, 2) == [3]"),
        (
            "type('R', (), {'__eq__': lambda s, o: type('T', (), {'__bool__': lambda s: True})()})()",
            "assert add(1, 2) == 3",
        ),
    ],
    ids=["eq", "ne", "int-subclass", "str-subclass", "list-subclass", "eq-returns-truthy"],
)
def test_objects_that_lie_about_equality_do_not_pass(returned, test):
    """An object whose ==, != or bool always says yes (subclasses of int/str/list too) fails the test."""
    _assert_forging_fails(f"def add(a, b):\n    return {returned}\n", tests=[test])


@pytest.mark.parametrize(
    "code, tests, passed",
    [
        (
            "from collections import Counter\ndef f(s):\n    return Counter(s)\n",
            ["assert f('aab') == {'a': 2, 'b': 1}", "assert f('a') == {'a': 2}"],
            1,
        ),
        (
            "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)\n",
            ["assert f() == (1, 2)", "assert f() == [1, 2]"],
            1,
        ),
        (
            "def f():\n    return 2.0\n",
            ["assert f() == 2", "assert 2 == f()", "assert f() != 2"],
            2,
        ),
        (
            "class Node:\n    pass\ndef f(x):\n    return Node() if x else None\n",
            [
                "assert f(1)",
                "assert f(1) is not None",
                "assert f(0) is None",
                "assert not f(0)",
                "assert f(0)",
            ],
            4,
        ),
        (
            "def f(x):\n    return sorted(x)\n",
            [
                "x = f([3, 1, 2])\nassert x == [1, 2, 3]",
                "assert f([2, 1]) == sorted([2, 1])",
                "assert 1 in f([1])",
                "assert len(f([1, 2])) < 2",
            ],
            3,
        ),
    ],
    ids=["counter", "namedtuple", "int-float", "objects-and-none", "statements-and-compares"],
)
def test_honest_code_keeps_its_score(code, tests, passed):
    """Honest code passes exactly the tests Python's own assert would pass."""
    result = run_code(code, asserts=tests, config=CONFIG)
    assert (result.passed, result.failed, result.reason) == (passed, len(tests) - passed, "ok")
