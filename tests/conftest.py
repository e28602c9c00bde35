"""Shared fixtures: tiny causal LMs built once per test session (see tiny_models.py).

    def test_x(tiny_lm_dir):
        model, tokenizer = load_tiny_causal_lm(tiny_lm_dir("llama"))

`tiny_lm_dir(arch, with_pad=True, vocab_size=None)` builds the folder on first use and returns
the same path afterwards; tests load their own copy from it, so nothing a
test does to its model leaks into another test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import tiny_models` from any test folder

from tiny_models import build_tiny_causal_lm  # noqa: E402


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: arch ("qwen2", "llama", "gpt2", or the base model "gemma3") -> folder of a saved
    tiny model + tokenizer (`vocab_size`: the model's, when not the tokenizer's)."""
    built: dict[tuple[str, bool, int | None], Path] = {}

    def get(arch: str = "qwen2", with_pad: bool = True, vocab_size: int | None = None) -> Path:
        key = (arch, with_pad, vocab_size)
        if key not in built:
            name = f"tiny-{arch}-{'pad' if with_pad else 'nopad'}-{vocab_size or 'v'}"
            built[key] = build_tiny_causal_lm(
                tmp_path_factory.mktemp(name), arch=arch, with_pad=with_pad, vocab_size=vocab_size
            )
        return built[key]

    return get
