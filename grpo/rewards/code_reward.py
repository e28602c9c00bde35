"""The code-execution reward: each completion's code run against its row's tests.

`code_execution_reward()` is a text reward callable over `grpo.rewards.sandbox.run_code`:
it takes the code out of the completion (`extract_code`), runs it against the row's
`tests` column (assert statements) or `io_pairs` column ((stdin, stdout) pairs) and
scores passed / total; a row with neither gets None. What the sandbox guarantees:
docs/sandbox.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo.rewards.parsers import completion_text
from grpo.rewards.sandbox import SandboxConfig, run_code

__all__ = ["code_execution_reward", "extract_code"]

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("python", "python3", "py")


def extract_code(text: str) -> str:
    """The code of `text`'s fenced blocks: the last one tagged Python (```python, ```Python,
    ```py, ```python3), else the last untagged one, else the whole text."""
    blocks = _FENCE.findall(text)
    python = [code for tag, code in blocks if tag.lower() in _PYTHON_TAGS]
    untagged = [code for tag, code in blocks if not tag]
    return (python or untagged or [text])[-1]


def _cell(column: str, index: int, value: Any) -> list[Any] | None:
    """A row's `tests` or `io_pairs` as a list (None or empty: the row has none); a numpy array
    or other sequence from a dataset becomes a list, a str is refused (it is not a list)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(
            f"{column}[{index}] must be a list (of assert statements, or of (stdin, stdout) "
            f"pairs), got a {type(value).__name__}: {str(value)[:60]!r}"
        )
    return list(value)


def code_execution_reward(
    config: SandboxConfig | None = None,
    *,
    extract: Callable[[str], str] = extract_code,
    max_workers: int = 1,
) -> Callable[..., list[float | None]]:
    """A text reward running each completion's code against its row's `tests` or `io_pairs`.

    The dataset column `tests` holds assert statements, `io_pairs` (stdin,
    stdout) pairs; a row with neither gets None (the reward does not apply).
    `max_workers` sandboxes run at once (threads that each wait on a process).
    """
    config = config or SandboxConfig()
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers must be a positive integer, got {max_workers!r}")

    def score_row(index: int, completion: Any, row_tests: Any, row_pairs: Any) -> float | None:
        row_tests, row_pairs = _cell("tests", index, row_tests), _cell("io_pairs", index, row_pairs)
        if not row_tests and not row_pairs:
            return None
        code = extract(completion_text(completion, index))
        if row_tests:
            return run_code(code, asserts=row_tests, config=config).score
        return run_code(code, io_pairs=row_pairs, config=config).score

    def code_execution(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        tests: Sequence[Sequence[str] | None] | None = None,
        io_pairs: Sequence[Sequence[tuple[str, str]] | None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        for name, column in (("tests", tests), ("io_pairs", io_pairs)):
            if column is not None and len(column) != len(completions):
                raise ValueError(
                    f"the {name} column has {len(column)} rows for {len(completions)} completions"
                )
        rows = [
            (
                i,
                c,
                tests[i] if tests is not None else None,
                io_pairs[i] if io_pairs is not None else None,
            )
            for i, c in enumerate(completions)
        ]
        if max_workers == 1:
            return [score_row(*row) for row in rows]
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            return list(pool.map(lambda row: score_row(*row), rows))

    return code_execution
