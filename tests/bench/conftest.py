"""The tiny base Gemma 3 models the gemma3 workload's bench tests run on, built once a session.

`answering_gemma3`: the tests' Gemma 3 (a sliding window of 8) taught to answer
" Answer: 7" or " I do not know." and go on to the next question
(`tiny_models.teach_plain_replies`): TRL's samples on word problems end at the plain
stop. `wide_gemma3`: a random one whose sliding window holds a word problem and its
answer, which grpo's lean engine (the workload's sampler) needs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_causal_lm, teach_plain_replies


@pytest.fixture(scope="session")
def answering_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = build_tiny_causal_lm(tmp_path_factory.mktemp("gemma3"), "gemma3", max_positions=1024)
    return teach_plain_replies(base, tmp_path_factory.mktemp("answering-gemma3"))


@pytest.fixture(scope="session")
def wide_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wide-gemma3")
    return build_tiny_causal_lm(path, "gemma3", max_positions=1024, sliding_window=1024)
