"""Plain nested dicts (parsed YAML) <-> the library's config dataclasses, strictly.

`from_dict(cls, data)` builds `cls` from a mapping: every key must be a field
(an unknown key is an error that lists the allowed ones), every value must
have the field's annotated type (ints are accepted for floats; lists for
tuples), nested dataclasses are built recursively, and the dataclass's own
`__post_init__` validation runs last. Every error names the full dotted key,
e.g. `grpo.batch_size: got 'many'; allowed: an integer`.

`to_dict(obj)` is the inverse: plain dicts, lists and scalars that YAML and
JSON can write.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

__all__ = ["ConfigError", "from_dict", "to_dict"]


class ConfigError(ValueError):
    """A configuration value or key that cannot be accepted; the message names the key."""


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "anything"
    if hint is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin in (tuple, list):
        return f"a list of {_describe(args[0])}" if args else "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _fail(key: str, value: Any, hint: Any) -> ConfigError:
    return ConfigError(f"{key}: got {value!r}; allowed: {_describe(hint)}")


def _convert(hint: Any, value: Any, key: str) -> Any:
    """`value` checked against the annotation `hint` (and converted: list -> tuple, int -> float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, key)
            except ConfigError as err:
                errors.append(err)
        # an option whose shape the value has failed inside: its message names the entry
        inner = [e for e in errors if not str(e).startswith(f"{key}: got ")]
        raise inner[0] if inner else _fail(key, value, hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise _fail(key, value, hint)
        return from_dict(hint, value, key)
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise _fail(key, value, hint)
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length
            if len(value) != len(args):
                raise _fail(key, value, hint)
            items = [
                _convert(a, v, f"{key}[{i}]")
                for i, (a, v) in enumerate(zip(args, value, strict=True))
            ]
        else:
            item = args[0] if args else Any
            items = [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin or hint) is tuple else items
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise _fail(key, value, hint)
        item = args[1] if args else Any
        return {str(k): _convert(item, v, f"{key}.{k}") for k, v in value.items()}
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(key, value, hint)
        return float(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _fail(key, value, hint)
    if hint in (bool, str) and not isinstance(value, hint):
        raise _fail(key, value, hint)
    if hint is type(None) and value is not None:
        raise _fail(key, value, hint)
    return value


def from_dict(cls: type, data: Mapping[str, Any], path: str = "") -> Any:
    """An instance of the dataclass `cls` from `data`, checked key by key (see module docs)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: got {data!r}; allowed: {_describe(cls)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(
            f"unknown key {where}{unknown[0]}; allowed keys{' of ' + path if path else ''}: "
            f"{', '.join(fields)}"
        )
    kwargs = {
        name: _convert(hints[name], value, f"{path}.{name}" if path else name)
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        message = str(err)
        last = path.rsplit(".", 1)[-1]
        if path and message.startswith(f"{last}.") and path != last:
            message = path + message[len(last) :]  # "vllm.x: ..." -> "rollout.vllm.x: ..."
        elif path and not message.startswith(path):
            message = f"{path}: {message}"
        raise ConfigError(message) from err


def to_dict(obj: Any) -> Any:
    """A dataclass (or nested values) as plain dicts, lists and scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj
