"""Config values a GGUF conversion states itself instead of taking transformers' defaults.

transformers builds a model's config from a GGUF file's metadata and takes every
value the file does not state from the config class's defaults: for Gemma 3 the
attention scale (`query_pre_attn_scalar`), which layers use the sliding window
(`layer_types`) and the local rope theta. A default that changed in another
transformers release would change the model without the conversion's logit check
noticing, since the GGUF-loaded model and the converted one would share it. So a
conversion may pin such values:

- `pin_config` checks each pin against the file's metadata wherever the file
  states the value (`METADATA`, per architecture), raising `ConversionError`
  that names the key when they disagree, then sets it on the config the model is
  built from;
- `write_pins` writes every pinned value into `config.json` explicitly (a
  transformers release may leave a value equal to its default out), and
  `check_pins` reads them back from the saved folder.

A pin names a config field, dotted into dicts: `rope_parameters.sliding_attention.rope_theta`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpo.lm.gguf_convert import ConversionError

__all__ = ["METADATA", "check_pins", "gguf_metadata", "pin_config", "write_pins"]


def _layer_types(pattern: Any, layers: int) -> list[str]:
    """llama.cpp's sliding-window pattern: every `pattern`-th layer full, or one flag per layer
    (True = sliding)."""
    if isinstance(pattern, list):
        return ["sliding_attention" if flag else "full_attention" for flag in pattern]
    return [
        "sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(layers)
    ]


Implied = Callable[[Any, int], Any]
METADATA: dict[str, dict[str, tuple[str, Implied]]] = {
    "gemma3": {
        "attention.sliding_window": ("sliding_window", lambda v, n: int(v)),
        "attention.sliding_window_pattern": ("layer_types", _layer_types),
        "attention.scale": ("query_pre_attn_scalar", lambda v, n: 1.0 / float(v) ** 2),
        "attention.key_length": ("head_dim", lambda v, n: int(v)),
        "rope.freq_base": ("rope_parameters.full_attention.rope_theta", lambda v, n: float(v)),
        "rope.freq_base_swa": ("rope_parameters.sliding_attention.rope_theta", lambda v, n: float(v)),
        "attn_logit_softcapping": ("attn_logit_softcapping", lambda v, n: float(v)),
        "final_logit_softcapping": ("final_logit_softcapping", lambda v, n: float(v)),
    },
}  # fmt: skip
"""Architecture -> metadata key (after "ARCH.") -> (the config field it states, its value there
given the metadata value and the number of layers)."""


def gguf_metadata(gguf_path: Path) -> dict[str, Any]:
    """Every metadata key of the file but the tokenizer's, with its value."""
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields
    return {k: f.contents() for k, f in fields.items() if not k.startswith("tokenizer.")}


def _get(config: Any, field: str) -> Any:
    first, *rest = field.split(".")
    value = config.get(first) if isinstance(config, dict) else getattr(config, first, None)
    for key in rest:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _set(config: Any, field: str, value: Any) -> None:
    *path, last = field.split(".")
    value = list(value) if isinstance(value, tuple) else value
    if not path:
        if isinstance(config, dict):
            config[last] = value
        else:
            setattr(config, last, value)
        return
    first, *rest = path
    if isinstance(config, dict):
        inner = config.setdefault(first, {})
    else:
        inner = getattr(config, first, None)
        if inner is None:
            inner = {}
            setattr(config, first, inner)
    for key in rest:
        inner = inner.setdefault(key, {})
    inner[last] = value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def pin_config(config: Any, pins: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Set every pin on `config` (a transformers config read from the GGUF file whose
    `metadata` is given) after checking it against the metadata; returns, per pin, the value,
    what transformers had read and the metadata key that states it (or None)."""
    arch = metadata.get("general.architecture", "")
    layers = int(metadata.get(f"{arch}.block_count", 0))
    stated = {field: (f"{arch}.{key}", implied) for key, (field, implied) in METADATA.get(arch, {}).items()}  # fmt: skip
    record = {}
    for field, value in pins.items():
        key, implied = stated.get(field, (None, None))
        if key is not None and key in metadata:
            from_file = implied(metadata[key], layers)
            if not _same(from_file, value):
                raise ConversionError(
                    f"the GGUF file's {key} = {metadata[key]!r} means {field} = {from_file!r}, "
                    f"but the conversion pins {field} = {value!r}: not the file the pin was written for"
                )
        first = field.split(".")[0]
        if not isinstance(config, dict) and not hasattr(config, first):
            raise ConversionError(  # a field the model never reads would pin nothing
                f"the conversion pins {field} = {value!r}, but the config transformers builds has "
                f"no field {first!r}: this transformers version spells it otherwise"
            )
        read = _get(config, field)
        _set(config, field, value)
        record[field] = {"pinned": _get(config, field), "transformers_read": read,
                         "stated_by": key if key in metadata else None}  # fmt: skip
    return record


def write_pins(config_json: Path, pins: Mapping[str, Any]) -> None:
    """Write every pinned value into `config_json` explicitly."""
    data = json.loads(config_json.read_text())
    for field, value in pins.items():
        _set(data, field, value)
    config_json.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_pins(folder: Path, pins: Mapping[str, Any]) -> None:
    """Every pin, read back from `folder`'s config.json and from the config transformers builds."""
    from transformers import AutoConfig

    written, loaded = (
        json.loads((folder / "config.json").read_text()),
        AutoConfig.from_pretrained(folder),
    )
    for field, value in pins.items():
        for where, config in (("config.json", written), ("the loaded config", loaded)):
            if not _same(_get(config, field), value):
                raise ConversionError(
                    f"{folder / 'config.json'}: {field} in {where} is {_get(config, field)!r}, "
                    f"not the pinned {value!r}"
                )
