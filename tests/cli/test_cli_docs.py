"""docs/config.md is generated from the config dataclasses and must be current."""

from __future__ import annotations

from pathlib import Path

from grpo.cli.docs import config_reference, field_docs
from grpo.config import GRPOConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_config_reference_is_current():
    """docs/config.md equals `python -m grpo.cli.docs` (regenerate it after changing a config)."""
    assert DOC.read_text() == config_reference(), "run: python -m grpo.cli.docs > docs/config.md"


def test_every_config_field_has_a_docstring():
    """Field docstrings are read from the source; every GRPOConfig field has one."""
    docs = field_docs(GRPOConfig)
    assert set(docs) == set(GRPOConfig.__dataclass_fields__)
    assert docs["group_size"].startswith("G: actions sampled per state")


def test_a_default_taken_from_another_key_names_that_key():
    """grpo.seed and policy.generation.seed default to the top-level seed: their cells read
    "= `seed`", never the interpolation string "${seed}"."""
    reference = config_reference()
    rows = {line.split(" | ")[0]: line for line in reference.splitlines() if line.startswith("| `")}
    assert rows["| `grpo.seed`"].split(" | ")[2] == "= `seed`"
    assert rows["| `policy.generation.seed`"].split(" | ")[2] == "= `seed`"
    assert "${" not in reference
