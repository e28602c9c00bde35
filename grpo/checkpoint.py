"""Atomic, pickle-free checkpoints of a training run (the framework API).

A checkpoint is one `torch.save` file holding only tensors and plain Python
values (dicts, lists, numbers, strings), so it loads with
`torch.load(weights_only=True)`: opening a checkpoint never runs code from it.

Writes are atomic: the file is written to a temporary name in the same
directory, flushed and fsync'ed, then renamed over the target with
`os.replace`, and the directory is fsync'ed. A crash at any point leaves either
the previous checkpoint or the new one, never a torn file.

Random state covers Python `random`, NumPy, torch CPU, every CUDA device
(when present) and the trainer's own shuffling generator, so that a resumed
run draws the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

__all__ = [
    "FORMAT_VERSION",
    "atomic_save",
    "atomic_write",
    "fsync_dir",
    "load",
    "model_state",
    "load_model_state",
    "rng_state",
    "set_rng_state",
]

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format_version", "policy", "optimizer", "step_count", "rng")


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """Call `write(file)` on a temporary file, then move it to `path`: readers see old or new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)  # make the rename itself durable


def atomic_save(state: dict[str, Any], path: str | os.PathLike) -> None:
    """`torch.save(state)` to `path` atomically (see `atomic_write`)."""
    atomic_write(path, lambda f: torch.save(state, f))


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint without unpickling objects; check it is complete."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:
        raise ValueError(
            f"checkpoint {str(path)!r} is not a readable grpo checkpoint: {err}"
        ) from err
    missing = (
        [key for key in REQUIRED_KEYS if key not in state]
        if isinstance(state, dict)
        else REQUIRED_KEYS
    )
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks required entries: {', '.join(missing)}")
    if state["format_version"] != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {str(path)!r} has format_version {state['format_version']!r}; "
            f"this version of grpo reads {FORMAT_VERSION}"
        )
    return state


def model_state(model: Any) -> dict[str, torch.Tensor]:
    """`state_dict()` when the model has one, else a detached copy of `get_parameters()`."""
    if callable(getattr(model, "state_dict", None)):
        return model.state_dict()
    return {name: p.detach().clone() for name, p in model.get_parameters().items()}


def load_model_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Inverse of `model_state`, copying in place so optimizers keep their parameters."""
    if callable(getattr(model, "load_state_dict", None)):
        model.load_state_dict(state)
        return
    params = model.get_parameters()
    if set(params) != set(state):
        raise ValueError(
            f"checkpoint parameters {sorted(state)} do not match the model's {sorted(params)}"
        )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name])


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """Every random-number state that a training step can consume, as plain values."""
    version, mt_state, gauss_next = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt_state), "gauss_next": gauss_next},
        "numpy": {
            "kind": np_kind,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Restore what `rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["kind"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])


def fsync_dir(directory: Path) -> None:
    # Not every platform lets a directory be opened for fsync (Windows); the
    # rename is still atomic there, only its durability is weaker.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
