"""Prompt datasets for text GRPO: load, validate, and draw batches of prompts.

A prompt record is a dict with a "prompt" (a non-empty str, or a list of chat
messages `{"role": ..., "content": ...}`) and any other columns (an answer,
test cases, ...) that reward functions receive as keyword arguments.

Sources: a list of dicts (or of bare prompts), a JSONL file (one JSON object
per line), or a `datasets.Dataset`. Every row is checked once, on loading,
and an error names the dataset, the row (or file line) and what was wrong.
Each record is a `PromptRecord`, a dict that remembers that row, so that an
error met later (a prompt too long for the model, a column a reward function
needs, a reward that fails on the sample) can name it too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PromptRecord", "check_prompt_lengths", "check_reward_columns", "load_prompts"]


class PromptRecord(dict):
    """A prompt record: a plain dict to every reader, plus `source`, the row it was read from."""

    source: str = ""
    """Where the row came from, e.g. "train prompts line 7 of 'train.jsonl'" (for errors)."""


def load_prompts(
    source: Any, *, prompt_key: str = "prompt", name: str = "dataset"
) -> list[PromptRecord]:
    """Rows of `source` as validated prompt records (prompt under the key "prompt")."""
    if isinstance(source, (str, os.PathLike)):
        numbered = _read_jsonl(Path(source), name)
        rows = [row for _, row in numbered]
        places = [f"{name} line {line} of {str(source)!r}" for line, _ in numbered]
    elif _is_hf_dataset(source):
        rows = [dict(row) for row in source]
        places = [f"{name} row {i}" for i in range(len(rows))]
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        rows = list(source)  # records loaded before keep the row they were read from
        places = [getattr(row, "source", "") or f"{name} row {i}" for i, row in enumerate(rows)]
    else:
        raise TypeError(
            f"{name}: got {type(source).__name__}; allowed: a list of dicts, a JSONL path "
            "or a datasets.Dataset"
        )
    if not rows:
        raise ValueError(f"{name} is empty; it needs at least one prompt")
    return [_record(row, prompt_key, where) for row, where in zip(rows, places, strict=True)]


def _is_hf_dataset(source: Any) -> bool:
    return type(source).__module__.startswith("datasets.") and hasattr(source, "column_names")


def _read_jsonl(path: Path, name: str) -> list[tuple[int, Any]]:
    """(line number, parsed row) of every non-blank line."""
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such JSONL file {str(path)!r}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank lines (e.g. a trailing newline) are not rows
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{name} line {number} of {str(path)!r} is not valid JSON: {err}"
                ) from err
    if not rows:
        raise ValueError(f"{name} is empty: {str(path)!r} holds no rows; it needs at least one")
    return rows


def _record(row: Any, prompt_key: str, where: str) -> PromptRecord:
    """Validate one row -> a new record with the prompt under "prompt"."""
    if isinstance(row, str) or (isinstance(row, list) and row and isinstance(row[0], Mapping)):
        row = {prompt_key: row}  # a bare prompt
    if not isinstance(row, Mapping):  # bad data, not a bad call: a ValueError like the rest
        raise ValueError(
            f"{where}: got {type(row).__name__} {row!r:.60}; allowed: a JSON object (dict) "
            f"with a {prompt_key!r} key"
        )
    if prompt_key not in row:
        raise ValueError(f"{where}: no {prompt_key!r} key; it has {sorted(row)}")
    record = PromptRecord((k, v) for k, v in row.items() if k != prompt_key)
    if prompt_key != "prompt" and "prompt" in record:
        raise ValueError(f"{where}: has both {prompt_key!r} and 'prompt'; rename one")
    record["prompt"] = _check_prompt(row[prompt_key], where)
    record.source = where
    return record


def _check_prompt(prompt: Any, where: str) -> str | list[dict[str, str]]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"{where}: the prompt is empty")
        return prompt
    if isinstance(prompt, Sequence) and prompt:
        for j, message in enumerate(prompt):
            ok = isinstance(message, Mapping) and isinstance(message.get("role"), str)
            if not (ok and isinstance(message.get("content"), str)):
                raise ValueError(
                    f"{where}: message {j} is {message!r}; allowed: {{'role': str, 'content': str}}"
                )
        return [dict(m) for m in prompt]
    raise ValueError(
        f"{where}: the prompt is {type(prompt).__name__} {prompt!r:.60}; allowed: a non-empty str "
        "or a non-empty list of chat messages"
    )


def check_prompt_lengths(
    rows: Sequence[Mapping[str, Any]], policy: Any, *, name: str = "dataset"
) -> None:
    """Fail before training if any row's prompt does not fit the policy's context."""
    for i, row in enumerate(rows):
        try:
            policy.encode_states([row])
        except ValueError as err:
            message = str(err).removeprefix("state 0: ")  # one row at a time: always state 0
            raise ValueError(f"{_where(row, i, name)}: {message}") from err


def check_reward_columns(
    rows: Sequence[Mapping[str, Any]], reward: Any, accuracy: Any = None
) -> None:
    """Fail before training if a row lacks a column that a reward function of `reward` (a
    `TextReward`; other reward models are not inspected) or `accuracy` requires."""
    from grpo.rewards.combine import TextReward

    if isinstance(reward, TextReward):
        reward.check_rows(rows)
    if accuracy is not None:
        TextReward(accuracy).check_rows(rows)


def _where(row: Any, i: int, name: str) -> str:
    return getattr(row, "source", "") or f"{name} row {i}"
