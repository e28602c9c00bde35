"""Parent side of the sandbox's verdicts: what the child evaluates, and how the parent judges it.

An assert test is parsed here, in the trainer's process, into the steps the
child runs and what the parent keeps:

- ``assert X == 3`` (one comparison, one side a literal): the child evaluates
  only X; the literal never leaves this process, and the comparison runs here on
  the plain data the child reported. Nothing the submitted code does can pass
  it without producing the expected value. The same holds for !=, <, in, is ...
  against a literal, though those expected values are easier to guess.
- ``assert X == Y`` (no literal), ``assert X``, ``assert not X``: the child
  evaluates X (and Y); the comparison or truth test still runs here. Whatever X
  does inside (``all(...)``, ``a < f() < b``) runs in the child, with the names
  the solution may have rebound.
- Anything else (several statements, setup code, ``is`` between two objects):
  the child runs it as a statement and reports whether it finished.

The child reports values as tagged JSON (see `_sandbox_asserts._make_encoder`):
built-in data only, read without calling any of the value's methods. Another
object arrives as an `Opaque`: it is not None, truthy when its class defines no
__bool__ or __len__, and equal to nothing.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
_SINGLETONS = (None, True, False)  # the only literals `is` compares sensibly with


@dataclass(frozen=True, eq=False)
class Opaque:
    """A value the child could not report as built-in data."""

    truthy: bool | None
    """True when bool() of it runs no code of its class (no __bool__ or __len__), else None."""


@dataclass(frozen=True)
class Check:
    """One assert test: the steps the child runs and what the parent does with their values."""

    steps: tuple[tuple[str, str], ...]
    """(mode, source) pairs run in order: mode "exec" (a statement) or "eval" (an expression)."""
    kind: str
    """"statement" (passes when it finishes), "truth" (value truthy) or "compare"."""
    op: Callable[[Any, Any], Any] | None = None
    """For "compare": the comparison, applied here to the reported values."""
    literal: Any = None
    """For "compare": the side held here, never sent to the child."""
    literal_side: int | None = None
    """0 or 1: which operand `literal` is; None when the child evaluates both."""
    negate: bool = False
    """`assert not ...`: the outcome is inverted."""

    def passes(self, values: list[Any]) -> bool:
        """Whether the test passes given the decoded values of its steps (fewer when one raised)."""
        if len(values) != len(self.steps):
            return False
        if self.kind == "statement":
            return True
        if self.kind == "truth":
            outcome = _truthy(values[0])
        else:
            operands = list(values)
            if self.literal_side is not None:
                operands.insert(self.literal_side, self.literal)
            outcome = _compare(self.op, *operands)
        return outcome is not None and outcome != self.negate  # None: Python's assert would raise


def parse_check(test: str) -> Check:
    """Split one assert test into child steps and parent-held parts (see the module docstring)."""
    statement = Check(steps=(("exec", test),), kind="statement")
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return statement  # fails in the child exactly as before
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return statement
    condition, negate = tree.body[0].test, False
    if isinstance(condition, ast.UnaryOp) and isinstance(condition.op, ast.Not):
        condition, negate = condition.operand, True
    source = ast.get_source_segment(test, condition)
    if source is None:
        return statement
    if not (isinstance(condition, ast.Compare) and len(condition.ops) == 1):
        return Check(steps=(("eval", source),), kind="truth", negate=negate)
    left, right, op = condition.left, condition.comparators[0], type(condition.ops[0])
    sides = [_literal(left), _literal(right)]
    segments = [ast.get_source_segment(test, node) for node in (left, right)]
    if None in segments or op not in _OPERATORS:
        return statement
    if op in (ast.Is, ast.IsNot) and not any(_is_singleton(side) for side in sides):
        return statement  # identity of anything but None/True/False is not reported
    if sides[1] is not _NOT_LITERAL:
        held = 1
    elif sides[0] is not _NOT_LITERAL:
        held = 0
    else:
        steps = tuple(("eval", segment) for segment in segments)
        return Check(steps=steps, kind="compare", op=_OPERATORS[op], negate=negate)
    return Check(
        steps=(("eval", segments[1 - held]),),
        kind="compare",
        op=_OPERATORS[op],
        literal=sides[held][0],
        literal_side=held,
        negate=negate,
    )


_NOT_LITERAL = object()


def _literal(node: ast.expr) -> Any:
    """(value,) for a literal expression node, else `_NOT_LITERAL`."""
    try:
        return (ast.literal_eval(node),)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _is_singleton(side: Any) -> bool:
    return side is not _NOT_LITERAL and any(side[0] is singleton for singleton in _SINGLETONS)


def _truthy(value: Any) -> bool | None:
    """bool(value), or None when it is not known without running the value's own code."""
    if isinstance(value, Opaque):
        return value.truthy
    return bool(value)


def _compare(op: Callable[[Any, Any], Any], left: Any, right: Any) -> bool | None:
    """op(left, right), or None when it cannot be decided here or would raise."""
    if op is not operator.is_ and op is not operator.is_not and _has_opaque(left, right):
        return None  # only identity with None/True/False is known for an opaque value
    try:
        return bool(op(left, right))
    except (TypeError, ValueError, RecursionError):
        return None  # e.g. 1 < "a": the assert would have raised


def _has_opaque(*values: Any) -> bool:
    return any(isinstance(v, Opaque) for v in values)


def decode(node: Any, depth: int = 0) -> Any:
    """The child's tagged JSON value as plain data; ValueError on anything malformed."""
    if depth > 200:
        raise ValueError("too deep")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [decode(item, depth + 1) for item in node]
    if not (isinstance(node, dict) and len(node) == 1):
        raise ValueError(f"not a tagged value: {node!r:.80}")
    ((tag, body),) = node.items()
    decoder = _TAGS.get(tag)
    if decoder is None:
        raise ValueError(f"unknown tag {tag!r}")
    try:
        return decoder(body, depth + 1)
    except (TypeError, AttributeError) as error:  # unhashable set items, wrong body shapes
        raise ValueError(f"malformed {tag!r} value") from error


def _items(body: Any, depth: int) -> list[Any]:
    if not isinstance(body, list):
        raise ValueError("expected a list")
    return [decode(item, depth) for item in body]


def _pairs(body: Any, depth: int) -> dict[Any, Any]:
    return {key: value for key, value in (_items(pair, depth) for pair in _items_raw(body))}


def _items_raw(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise ValueError("expected a list")
    return body


def _special_float(body: Any, depth: int) -> float:
    if body not in ("nan", "inf", "-inf"):
        raise ValueError(f"bad float {body!r}")
    return math.nan if body == "nan" else float(body)


_TAGS: dict[str, Callable[[Any, int], Any]] = {
    "t": lambda body, depth: tuple(_items(body, depth)),
    "s": lambda body, depth: set(_items(body, depth)),
    "fs": lambda body, depth: frozenset(_items(body, depth)),
    "d": _pairs,
    "f": _special_float,
    "b": lambda body, depth: bytes.fromhex(body),
    "ba": lambda body, depth: bytearray.fromhex(body),
    "c": lambda body, depth: complex(*(float(part) for part in _items(body, depth))),
    "o": lambda body, depth: Opaque(truthy=True if body is True else None),
    "u": lambda body, depth: Opaque(truthy=None),  # too deep, cyclic or too large
}
