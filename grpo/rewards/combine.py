"""`TextReward`: text reward callables combined into one `RewardModel` (the framework API's contract).

The contract for a reward function is a plain callable

    reward(prompts, completions, **columns) -> list[float | None]

over N aligned samples: `prompts[n]` is the prompt (a str or a list of chat
messages), `completions[n]` the completion text, and every other column of the
prompt records (e.g. "answer") arrives as a keyword argument holding a list of
N values. A function that does not take `**kwargs` gets only the columns it
names as parameters; a parameter without a default is a column every record
must have (`check_rows` checks a dataset before training; `score` each sample).

Combination: reward_n = Σ_f w_f · r_f(n). `None` means "does not apply":
it is left out of that function's mean and std, and adds 0 to the weighted
sum. A sample for which *every* function returns None has no reward at all;
by default that is an error (`all_none="error"`), or it gets reward 0
(`all_none="zero"`).

Checks at this boundary (each message names the function and the sample, and
the row a `grpo.run.data.PromptRecord` was read from): a function that raises
is re-run one sample at a time to find the sample it fails on, and the line of
its file it raised at is named; a wrong number of values, a non-number, NaN/inf
or a missing required column is an error. All of these are `RewardError`s
(`grpo.rewards.calls`).

Time: each call of a reward function is stopped after `timeout_seconds` (600 s by
default; None = no limit), in whichever thread it runs (`grpo.rewards.time_limit`: the
main thread, or a sampling thread with `run.max_staleness` >= 1). A call stopped so is
re-run one sample at a time under the same limit, and the `RewardError` names the
function and the first sample that runs over it alone: a reward that hangs stops the
run with one message instead of holding it silently.

Metrics of the last call (`last_metrics`): "rewards/<name>/mean" and
"rewards/<name>/std" over the samples where <name> applies,
"rewards/<name>/applied_frac", and "reward/positive_frac" of the combined
reward (the chess loop's "fraction of positive rewards").
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from grpo.rewards.calls import call_reward
from grpo.rewards.errors import RewardError

__all__ = ["RewardError", "RewardFunction", "TextReward", "split_states"]

RewardFunction = Callable[..., Sequence[Any]]
RESERVED = ("prompts", "completions")
TIMEOUT_SECONDS = 600.0  # a reward function's call, over a step's N samples


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def split_states(states: Sequence[Any]) -> tuple[list[Any], dict[str, list[Any]]]:
    """Prompt records -> (prompts (N,), {column: values (N,)}) for the reward contract."""
    prompts: list[Any] = []
    columns: dict[str, list[Any]] = {}
    for n, state in enumerate(states):
        if isinstance(state, Mapping):
            if "prompt" not in state:
                raise ValueError(
                    f"state {n}: a dict state needs a 'prompt' key; got keys {list(state)}"
                )
            prompts.append(state["prompt"])
            for key in state:
                if key != "prompt":
                    columns.setdefault(key, [None] * n)
        else:
            prompts.append(state)
        for key, values in columns.items():
            values.append(state.get(key) if isinstance(state, Mapping) else None)
    for key in columns:
        if key in RESERVED:
            raise ValueError(f"dataset column {key!r} clashes with a reward argument; rename it")
    return prompts, columns


class TextReward:
    """Weighted sum of text reward functions, usable as the trainer's reward model."""

    def __init__(
        self,
        functions: RewardFunction | Sequence[RewardFunction] | Mapping[str, RewardFunction],
        weights: Sequence[float] | None = None,
        *,
        all_none: str = "error",
        timeout_seconds: float | None = TIMEOUT_SECONDS,
    ) -> None:
        """`timeout_seconds`: the longest one call of a reward function may run (None = no
        limit); a call over it is a `RewardError` naming the function and the sample."""
        if isinstance(functions, Mapping):
            named = list(functions.items())
        else:
            fns = [functions] if callable(functions) else list(functions)
            named = [(_name(fn), fn) for fn in fns]
        if not named:
            raise ValueError("functions: got none; allowed: one or more reward callables")
        names = [name for name, _ in named]
        for name, fn in named:
            if not callable(fn):
                raise TypeError(
                    f"reward function {name!r}: got {type(fn).__name__}; allowed: a callable"
                )
            if names.count(name) > 1:
                raise ValueError(
                    f"two reward functions are named {name!r}; pass a dict {{name: fn}}"
                )
        weights = [1.0] * len(named) if weights is None else list(weights)
        if len(weights) != len(named):
            raise ValueError(f"weights: got {len(weights)} for {len(named)} reward functions")
        for name, w in zip(names, weights, strict=True):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ValueError(f"weight of {name!r}: got {w!r}; allowed: a finite number")
        if all_none not in ("error", "zero"):
            raise ValueError(f"all_none: got {all_none!r}; allowed: 'error', 'zero'")
        t = timeout_seconds
        if t is not None and not (isinstance(t, (int, float)) and 0 < t < math.inf):
            raise ValueError(f"timeout_seconds: got {t!r}; allowed: a number > 0, or None")
        self.timeout_seconds = None if t is None else float(t)
        self.functions = dict(named)
        self.required = {name: _required_columns(name, fn) for name, fn in named}
        """The columns each function requires: its parameters without a default."""
        self.weights = dict(zip(names, (float(w) for w in weights), strict=True))
        self.all_none = all_none
        self.last_metrics: dict[str, float] = {}

    # the RewardModel protocol: nothing here holds tensors or has modes
    def to(self, device: Any) -> TextReward:
        return self

    def eval(self) -> TextReward:
        return self

    def train(self) -> TextReward:
        return self

    def check_rows(self, rows: Sequence[Any]) -> None:
        """Raise a ValueError naming the first row that lacks a column some function requires
        (or has one named like a reward argument), before any completion exists."""
        found = self._column_problem(rows)
        if found is not None:
            i, problem = found
            raise ValueError(f"{getattr(rows[i], 'source', '') or f'row {i}'}: {problem}")

    def _column_problem(self, rows: Sequence[Any]) -> tuple[int, str] | None:
        """(index, what is wrong) of the first row whose columns do not suit the functions."""
        seen: set[frozenset] = set()
        for i, row in enumerate(rows):
            keys = frozenset(row) if isinstance(row, Mapping) else frozenset(["prompt"])
            if keys not in seen:  # rows with the same columns pass or fail alike
                seen.add(keys)
                problem = self._keys_problem(keys)
                if problem is not None:
                    return i, problem
        return None

    def _keys_problem(self, keys: frozenset) -> str | None:
        for key in RESERVED:
            if key in keys:
                return f"column {key!r} clashes with a reward argument; rename it"
        for name, required in self.required.items():
            missing = [c for c in required if c not in keys]
            if missing:
                return (
                    f"no column {missing[0]!r}, which reward function {name!r} requires (the "
                    f"row has {sorted(keys)}); add it to every row, or give the parameter a default"
                )
        return None

    def compute_rewards(self, states: Sequence[Any], actions: Sequence[Any]) -> Tensor:
        """Combined rewards of N state-action pairs -> (N,) float32."""
        rewards, _ = self.score(states, actions)
        return rewards

    def score(
        self, states: Sequence[Any], actions: Sequence[Any]
    ) -> tuple[Tensor, dict[str, list[float | None]]]:
        """Combined rewards (N,) and each function's raw values (None = does not apply)."""
        if len(states) != len(actions):
            raise ValueError(f"states and actions must align; got {len(states)} and {len(actions)}")
        prompts, columns = split_states(states)
        describe = partial(_describe, prompts, states)
        found = self._column_problem(states)
        if found is not None:  # a function would get None (or nothing) for a column it needs
            raise RewardError(f"{describe(found[0])}: {found[1]}")
        texts = [getattr(a, "text", a) for a in actions]  # Completion records or plain strings
        per_function = {
            name: self._call(name, fn, prompts, texts, columns, describe)
            for name, fn in self.functions.items()
        }
        rewards = self._combine(per_function, describe, len(prompts))
        self.last_metrics = _metrics(per_function, rewards)
        return rewards, per_function

    def _call(
        self, name: str, fn: RewardFunction, prompts: list, texts: list, columns: dict,
        describe: Callable[[int], str],
    ) -> list:  # fmt: skip
        kwargs = _accepted(fn, columns)
        return call_reward(name, fn, prompts, texts, kwargs, describe, self.timeout_seconds)

    def _combine(
        self, per_function: dict[str, list], describe: Callable[[int], str], N: int
    ) -> Tensor:
        rewards = torch.zeros(N, dtype=torch.float64)  # (N,)
        applied = torch.zeros(N, dtype=torch.bool)  # (N,) some function gave a value
        for name, values in per_function.items():
            for n, v in enumerate(values):
                if v is not None:
                    rewards[n] += self.weights[name] * v
                    applied[n] = True
        if self.all_none == "error" and not bool(applied.all()):
            n = int((~applied).nonzero()[0])
            raise RewardError(
                f"every reward function returned None for {describe(n)}; "
                "return a value from at least one, or use all_none='zero'"
            )
        return rewards.float()


def _accepted(fn: Callable, columns: dict[str, list]) -> dict[str, list]:
    """All columns for a **kwargs function, else only the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature get everything
        return columns
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return columns
    names = {p.name for p in params}
    return {k: v for k, v in columns.items() if k in names}


def _required_columns(name: str, fn: Callable) -> tuple[str, ...]:
    """The parameters `fn` needs besides (prompts, completions): columns it requires."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: checked when called
        return ()
    try:
        bound = signature.bind_partial([], []).arguments  # prompts, completions: positional
        required = tuple(
            p.name
            for p in signature.parameters.values()
            if p.name not in bound
            and p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )
        signature.bind([], [], **dict.fromkeys(required, []))
    except TypeError as err:
        raise ValueError(
            f"reward function {name!r} cannot be called as {name}(prompts, completions, "
            f"**columns): {err}"
        ) from err
    return required


def _metrics(per_function: dict[str, list], rewards: Tensor) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name, values in per_function.items():
        applied = torch.tensor([v for v in values if v is not None], dtype=torch.float64)
        metrics[f"rewards/{name}/applied_frac"] = len(applied) / max(len(values), 1)
        if len(applied):
            metrics[f"rewards/{name}/mean"] = applied.mean().item()
            metrics[f"rewards/{name}/std"] = applied.std(unbiased=False).item()
    metrics["reward/positive_frac"] = (rewards > 0).double().mean().item() if len(rewards) else 0.0
    return metrics


def _describe(prompts: list, states: Sequence[Any], n: int) -> str:
    """ "sample n (prompt '...', train prompts line 7 of 'x.jsonl')" for messages."""
    source = getattr(states[n], "source", "")
    return f"sample {n} (prompt {_preview(prompts[n])}{', ' + source if source else ''})"


def _preview(prompt: Any, limit: int = 80) -> str:
    text = prompt if isinstance(prompt, str) else str(prompt)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
