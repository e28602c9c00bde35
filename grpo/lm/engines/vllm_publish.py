"""Publishing the trainer's weights to a folder that vLLM servers reload from.

One sub-folder per version, `weights-<label>/model.safetensors`, so a server
never reads a half-written file: the tensors are written under a temporary
name inside a hidden temporary folder, renamed to `model.safetensors`, and the
folder is renamed to its final name last (a rename is atomic on one
filesystem). Free space is checked before writing (the new version, while the
old ones still exist), and versions older than the newest `keep` are deleted
once the servers hold a newer one.

Tensors that share storage (a tied head and embedding) are written as
separate copies under each name: safetensors refuses aliases, and vLLM's
in-place reload needs every name (its CPU backend packs the head separately:
without `lm_head.weight` it logs "ParallelLMHead: Failed to load weights" and
keeps the old head).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

__all__ = ["PREFIX", "free_space_problem", "prune_versions", "publish_weights", "separate_tensors"]

PREFIX = "weights-"
"""Name prefix of every published version folder (only these are ever deleted)."""
SPACE_MARGIN = 64 << 20
"""Bytes left free beyond the new version itself."""


def separate_tensors(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The weights detached, contiguous and on the CPU, a second name of one storage given its
    own copy (safetensors writes no aliases)."""
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for name, tensor in weights.items():
        if hasattr(tensor, "full_tensor"):  # an FSDP2 shard: every rank gathers it (collective)
            tensor = tensor.full_tensor()
        tensor = tensor.detach().to("cpu").contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def free_space_problem(folder: Path, needed: int) -> str | None:
    """Why `needed` bytes cannot be written to `folder` (None when they can)."""
    free = shutil.disk_usage(folder).free
    if free >= needed + SPACE_MARGIN:
        return None
    return (
        f"{folder} has {free / 2**20:.0f} MiB free, but a weight version needs "
        f"{needed / 2**20:.0f} MiB (+ {SPACE_MARGIN >> 20} MiB margin); free space there, "
        "lower rollout.server.keep_versions, or set another rollout.server.publish_dir"
    )


def publish_weights(folder: Path, label: str, weights: Mapping[str, Tensor]) -> Path:
    """Write `weights` as `folder/weights-<label>/model.safetensors`, atomically; returns the
    version folder. Raises OSError when the free space is too small."""
    tensors = separate_tensors(weights)
    needed = sum(t.numel() * t.element_size() for t in tensors.values())
    problem = free_space_problem(folder, needed)
    if problem is not None:
        raise OSError(f"cannot publish the trainer's weights: {problem}")
    final = folder / f"{PREFIX}{label}"
    partial = folder / f".partial-{label}"
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-write
    partial.mkdir()
    try:
        save_file(tensors, str(partial / "model.safetensors.tmp"))
        os.replace(partial / "model.safetensors.tmp", partial / "model.safetensors")
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def prune_versions(folder: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest version folders (by modification time); returns the
    ones deleted. Half-written ones (hidden) are left to `publish_weights`."""
    versions = sorted(
        (p for p in folder.iterdir() if p.is_dir() and p.name.startswith(PREFIX)),
        key=lambda p: p.stat().st_mtime_ns,
    )
    old = versions[: max(0, len(versions) - keep)]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old
