"""`docs/config.md`, generated from the config dataclasses and their field docstrings.

    python -m grpo.cli.docs > docs/config.md

Each field's documentation is the string literal under it in the class body
(read with `ast`), so the reference cannot drift from the code: a test
compares the file with this module's output.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from typing import Any

from grpo.run.config import RunConfig
from grpo.run.config_files import RUN_DEFAULTS
from grpo.run.presets import PRESETS
from grpo.run.structured import to_dict

__all__ = ["config_reference", "field_docs"]

HEADER = """# Configuration reference

Every key of a `grpo train` config file, generated from the dataclasses that
read it (`python -m grpo.cli.docs > docs/config.md`; a test fails when this
file is stale). A config is YAML; every key is optional. Values merge in this
order, later winning: the defaults below, the `preset`'s values, the file,
then `--set key=value` on the command line. Unknown keys, wrong types and
contradictory values are rejected before any model loads, with the key named.
The keys for CUDA (`model.device: cuda`), vLLM on a GPU (`rollout`) and several
GPUs (`distributed`) are tested on CPUs only and have not run on a GPU yet
([what has run where](../README.md#what-works-and-where-it-has-run)).

```bash
grpo train configs/demo.yaml --set schedule.num_steps=200 --set run.dir=runs/demo-200
```
"""


def field_docs(cls: type) -> dict[str, str]:
    """{field name: the docstring written under it} for a dataclass."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and is_doc:
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _dataclass_of(annotation: Any) -> type | None:
    """The dataclass inside an annotation such as `LoraSettings | None`, if any."""
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def _list_item(annotation: Any) -> type | None:
    """D for `list[D]` of a dataclass D, alone or as one option of a union; else None."""
    for option in [annotation, *typing.get_args(annotation)]:
        args = typing.get_args(option)
        if typing.get_origin(option) is list and args and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a literal bar inside a Markdown table cell


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"' if value else '""'
    return f"{value}"


def _default(value: Any) -> str:
    """A table's default cell: the value as code, or `= KEY` for a value that is another
    key's (an OmegaConf interpolation such as `${seed}`)."""
    if isinstance(value, str) and (ref := re.fullmatch(r"\$\{([\w.]+)\}", value)):
        return f"= `{ref[1]}`"
    return f"`{_value(value)}`"


def _field_default(f: dataclasses.Field) -> Any:
    """A field's own default, for sections that are null by default (e.g. model.lora)."""
    if f.default is not dataclasses.MISSING:
        return to_dict(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return to_dict(f.default_factory())
    return None


def _rows(cls: type, defaults: Any, prefix: str) -> list[str]:
    """Table rows `| key | type | default | meaning |` of `cls`, recursing into nested sections."""
    hints = typing.get_type_hints(cls)
    raw = {f.name: f.type for f in dataclasses.fields(cls)}
    docs = field_docs(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = defaults[f.name] if defaults and f.name in defaults else _field_default(f)
        nested = _dataclass_of(hints[f.name])
        item = _list_item(hints[f.name])
        if item is not None:  # a list of sections; another accepted form is in the docstring
            kind = "list" if typing.get_origin(hints[f.name]) is list else "list or mapping"
            doc = _cell(docs.get(f.name, ""))
            rows.append(f"| `{key}` | {kind} | {_default(default)} | {doc} |")
            rows.extend(_rows(item, None, f"{key}[]."))
            continue
        if nested is not None:
            if default is None:
                rows.append(f"| `{key}` | section | `null` | {docs.get(f.name, '')} |")
            rows.extend(_rows(nested, default, f"{key}."))
            continue
        kind = str(raw[f.name]).replace("|", "or")
        rows.append(f"| `{key}` | {kind} | {_default(default)} | {_cell(docs.get(f.name, ''))} |")
    return rows


def config_reference() -> str:
    """The whole of docs/config.md."""
    defaults = to_dict(RunConfig())
    section_defaults = RUN_DEFAULTS  # where a run departs from the declared defaults
    hints = typing.get_type_hints(RunConfig)
    docs = field_docs(RunConfig)
    parts = [HEADER, "## Top level\n", "| key | type | default | meaning |", "|---|---|---|---|"]
    sections = []
    for f in dataclasses.fields(RunConfig):
        nested = _dataclass_of(hints[f.name])
        if nested is None:
            kind = str(f.type).replace("|", "or")
            parts.append(f"| `{f.name}` | {kind} | {_default(defaults[f.name])} | {docs[f.name]} |")
            continue
        summary = " ".join((nested.__doc__ or "").split())
        sections += [f"\n## `{f.name}`: {docs[f.name]}\n", f"{summary}\n"]
        sections += ["| key | type | default | meaning |", "|---|---|---|---|"]
        sections += _rows(nested, section_defaults.get(f.name), f"{f.name}.")
    presets = ["\n## Presets (`preset: NAME`)\n", "| name | what it sets |", "|---|---|"]
    presets += [f"| `{name}` | {p.description} |" for name, p in PRESETS.items()]
    return "\n".join(parts + sections + presets) + "\n"


if __name__ == "__main__":
    print(config_reference(), end="")
