"""Prompt datasets for text GRPO: load, validate, and draw batches of prompts.

A prompt record is a dict with a "prompt" (a non-empty str, or a list of chat
messages `{"role": ..., "content": ...}`) and any other columns (an answer,
test cases, ...) that reward functions receive as keyword arguments.

Sources: a list of dicts (or of bare prompts), a JSONL file (one JSON object
per line), or a `datasets.Dataset`. Every row is checked once, on loading,
and an error names the dataset, the row (or line) and what was wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["check_prompt_lengths", "load_prompts"]


def load_prompts(
    source: Any, *, prompt_key: str = "prompt", name: str = "dataset"
) -> list[dict[str, Any]]:
    """Rows of `source` as validated prompt records (prompt under the key "prompt")."""
    if isinstance(source, (str, os.PathLike)):
        rows, where = _read_jsonl(Path(source), name), "line"
    elif _is_hf_dataset(source):
        rows, where = [dict(row) for row in source], "row"
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        rows, where = list(source), "row"
    else:
        raise TypeError(
            f"{name}: got {type(source).__name__}; allowed: a list of dicts, a JSONL path "
            "or a datasets.Dataset"
        )
    if not rows:
        raise ValueError(f"{name} is empty; it needs at least one prompt")
    first = 1 if where == "line" else 0
    return [_record(row, prompt_key, f"{name} {where} {i + first}") for i, row in enumerate(rows)]


def _is_hf_dataset(source: Any) -> bool:
    return type(source).__module__.startswith("datasets.") and hasattr(source, "column_names")


def _read_jsonl(path: Path, name: str) -> list[Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such JSONL file {str(path)!r}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank lines (e.g. a trailing newline) are not rows
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{name} line {number} of {str(path)!r} is not valid JSON: {err}"
                ) from err
    return rows


def _record(row: Any, prompt_key: str, where: str) -> dict[str, Any]:
    """Validate one row -> a new dict with the prompt under "prompt"."""
    if isinstance(row, str) or (isinstance(row, list) and row and isinstance(row[0], Mapping)):
        row = {prompt_key: row}  # a bare prompt
    if not isinstance(row, Mapping):
        raise TypeError(
            f"{where}: got {type(row).__name__}; allowed: a dict with a {prompt_key!r} key"
        )
    if prompt_key not in row:
        raise ValueError(f"{where}: no {prompt_key!r} key; it has {sorted(row)}")
    record = {k: v for k, v in row.items() if k != prompt_key}
    if prompt_key != "prompt" and "prompt" in record:
        raise ValueError(f"{where}: has both {prompt_key!r} and 'prompt'; rename one")
    record["prompt"] = _check_prompt(row[prompt_key], where)
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
            raise ValueError(f"{name} row {i}: {err}") from err
