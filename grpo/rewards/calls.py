"""One call of a reward function under the reward contract (`grpo.rewards.combine`).

`call_reward` runs `fn(prompts, completions, **columns)` under a time limit
(`grpo.rewards.time_limit`, in any thread), and turns whatever goes wrong into a
`RewardError` naming the function and the sample: a call that raises or runs out of
time is re-run one sample at a time (under the same limit) to find the first sample
it fails on alone, and the line of the function's file it was at is named; values
that are not one finite number or None per sample are named with their sample.
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from torch import Tensor

from grpo.rewards.errors import RewardError
from grpo.rewards.time_limit import TimeLimitExceeded, time_limit

__all__ = ["call_reward"]


def call_reward(
    name: str, fn: Callable, prompts: list, texts: list, kwargs: dict,
    describe: Callable[[int], str], timeout_seconds: float | None,
) -> list[float | None]:  # fmt: skip
    """`fn`'s checked values for the N samples, or a `RewardError` naming `name` and the sample
    (`describe(n)`); `kwargs`: the columns `fn` takes, N values each."""
    call = partial(_limited, fn, timeout_seconds)
    limit = time_limit(timeout_seconds)
    try:
        with limit:
            values = fn(prompts, texts, **kwargs)
    except limit.error as err:
        n = _failing_sample(call, prompts, texts, kwargs, timed_out=True)
        alone = describe(n) if n is not None else f"a batch of {len(texts)} (no sample alone)"
        raise RewardError(
            f"reward function {name!r} ran longer than its {timeout_seconds:g} s on "
            f"{alone}{_raised_at(fn, err, 'stopped')}; make it faster or raise "
            "TextReward's timeout_seconds"
        ) from None
    except Exception as err:
        n = _failing_sample(call, prompts, texts, kwargs)
        where = describe(n) if n is not None else f"a batch of {len(texts)}"
        raise RewardError(
            f"reward function {name!r} raised on {where}: {_one_line(err)}{_raised_at(fn, err)}"
        ) from err
    return _check_values(name, values, describe, len(texts))


def _limited(fn: Callable, seconds: float | None, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` stopped after `seconds` (raising `TimeLimitExceeded`)."""
    with time_limit(seconds):
        return fn(*args, **kwargs)


def _failing_sample(
    call: Callable, prompts: list, texts: list, kwargs: dict, timed_out: bool = False
) -> int | None:
    """Index of the first sample on which `call`, on that sample alone, raises (`timed_out`:
    runs out of time); either way a sample that runs out of time ends the search."""
    for n in range(len(texts)):
        try:
            call([prompts[n]], [texts[n]], **{k: [v[n]] for k, v in kwargs.items()})
        except TimeLimitExceeded:
            return n
        except Exception:
            if not timed_out:
                return n
    return None


def _check_values(
    name: str, values: Any, describe: Callable[[int], str], N: int
) -> list[float | None]:
    if isinstance(values, Tensor):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise RewardError(
            f"reward function {name!r} returned {type(values).__name__}; allowed: a list of "
            f"{N} numbers or None, one per sample"
        )
    if len(values) != N:
        raise RewardError(
            f"reward function {name!r} returned {len(values)} values for {N} samples; "
            "allowed: one number or None per sample"
        )
    out: list[float | None] = []
    for n, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if not isinstance(v, (int, float)):  # a bool counts as 0 or 1
            raise RewardError(
                f"reward function {name!r} returned {type(v).__name__} {v!r:.40} for "
                f"{describe(n)}; allowed: a number or None"
            )
        if not math.isfinite(v):
            raise RewardError(
                f"reward function {name!r} returned {v} for {describe(n)}; rewards must be finite"
            )
        out.append(float(v))
    return out


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def _raised_at(fn: Callable, err: BaseException, verb: str = "") -> str:
    """ " at file.py:12": the deepest line of the function's own file in the traceback."""
    frames = traceback.extract_tb(err.__traceback__)[1:]  # [0] is the call in `call_reward`
    try:
        own = inspect.getsourcefile(fn)
    except TypeError:
        own = None
    mine = [f for f in frames if f.filename == own] or frames
    where = f" at {mine[-1].filename}:{mine[-1].lineno}" if mine else ""
    return f" ({verb}{where})" if verb and where else where
