"""The layers of docs/architecture.md: every import in `grpo` goes down, never up or sideways.

Every `import` statement in the package is read (function-level ones too: an
import inside a function is still a dependency), mapped to the part of the
package it names, and checked against `LAYERS`: a part may import itself and
parts of lower layers only, so no two parts can import each other.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grpo"

# bottom to top; parts in one layer may not import each other
LAYERS: list[set[str]] = [
    {"functional"},
    {"protocols", "records", "config", "checkpoint", "precision", "licence"},
    {"lm", "masked_fill", "rewards", "distributed"},
    {"envs"},
    {"tasks"},
    {"step"},
    {"run"},
    {"cli"},
    # the framework API's import paths and the package's own front door
    {"__init__", "__main__", "experience_collector", "advantage_estimator", "grpo_objective",
     "trainer"},
]  # fmt: skip
LAYER = {part: depth for depth, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str | None:
    """`grpo.lm.scoring` -> "lm"; None for modules outside the package."""
    names = module.split(".")
    if names[0] != "grpo":
        return None
    return names[1] if len(names) > 1 else "__init__"


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    names = list(relative.parts)
    if names[-1] == "__init__" and len(names) > 1:
        names = names[:-1]
    return ".".join(names)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if module == "grpo":  # `from grpo import distributed` names a part
                found += [(node.lineno, f"grpo.{alias.name}") for alias in node.names]
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = part_of(module_name(path))
        if importer == "__init__" and path.parent != PACKAGE:
            continue  # pragma: no cover - only grpo/__init__.py maps to "__init__"
        if importer not in LAYER:
            bad.append(f"{path.relative_to(PACKAGE.parent)}: part {importer!r} has no layer")
            continue
        for line, module in imported_modules(path):
            target = part_of(module)
            if target is None or target == importer or module == "grpo":
                continue
            if target not in LAYER:
                continue  # a name imported from the package root, e.g. `from grpo import X`
            if LAYER[target] >= LAYER[importer]:
                bad.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: {importer} (layer "
                    f"{LAYER[importer]}) imports {module} (layer {LAYER[target]})"
                )
    return bad


def test_every_import_goes_down_a_layer():
    """No part of grpo imports a part of its own layer or a higher one."""
    assert violations() == []


def test_the_checker_catches_an_upward_and_a_sideways_import(tmp_path, monkeypatch):
    """A file of `functional` importing `step`, and `lm` importing `rewards`, are reported."""
    fake = tmp_path / "grpo"
    (fake / "functional").mkdir(parents=True)
    (fake / "lm").mkdir()
    (fake / "functional" / "bad.py").write_text("def f():\n    from grpo.step import trainer\n")
    (fake / "lm" / "side.py").write_text("from grpo.rewards.parsers import compose_parsers\n")
    (fake / "lm" / "fine.py").write_text("from grpo.functional import losses\nimport torch\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = violations()
    assert len(found) == 2, found
    assert "functional (layer 0) imports grpo.step" in found[0]
    assert "lm (layer 2) imports grpo.rewards.parsers" in found[1]


@pytest.mark.parametrize(
    ("module", "part"), [("grpo.lm.engines.vllm", "lm"), ("grpo", "__init__"), ("torch", None)]
)
def test_part_of_names_the_top_level_part(module, part):
    """A module maps to the package part right under `grpo`."""
    assert part_of(module) == part
