"""Input checks shared by the `grpo.functional` modules.

Each raises a `ValueError` that names the argument, what it got and what is
allowed, so a caller can fix the call without reading the maths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from torch import Tensor

V_ = TypeVar("V_")


def lookup(table: Mapping[str, V_], name: Any, argument: str) -> V_:
    """`table[name]`, or a ValueError listing the allowed names."""
    if not isinstance(name, str) or name not in table:
        allowed = ", ".join(repr(key) for key in table)
        raise ValueError(f"{argument}: got {name!r}; allowed: {allowed}")
    return table[name]


def check_tensor(tensor: Any, argument: str) -> Tensor:
    """Raise a TypeError unless `tensor` is a torch.Tensor."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{argument}: expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def check_shape(tensor: Any, argument: str, shape: tuple[int, ...], like: str) -> None:
    """Raise unless `tensor` is a Tensor of exactly `shape` (the shape of `like`)."""
    check_tensor(tensor, argument)
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"{argument}: shape {tuple(tensor.shape)} does not match {like} {tuple(shape)}"
        )


def check_positive(value: Any, argument: str, allow_zero: bool = False) -> float:
    """A finite real number > 0 (or >= 0 with `allow_zero`), as a float."""
    bound = ">= 0" if allow_zero else "> 0"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{argument}: got {value!r}; allowed: a finite number {bound}") from None
    ok = number >= 0 if allow_zero else number > 0
    if not ok or number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"{argument}: got {value!r}; allowed: a finite number {bound}")
    return number
