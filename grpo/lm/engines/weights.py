"""Giving an inference engine the trainer's weights: names, zero-copy sharing, copies, checks.

picoRL shares weights between vLLM and the trainer by rebinding storage,
`p.data = hf_p.data`, so that an optimizer step on the trainer's tensors is
what vLLM computes with, with no copy. Everything here is plain torch over two
`{name: tensor}` dicts (the engine's parameters and the trainer's), so it runs
and is tested on CPU with two ordinary modules.

Departures from picoRL's loop:
- Names are compared after dropping wrapper prefixes ("model.", "base_model.model.",
  "language_model.") and PEFT's ".base_layer", on both sides.
- vLLM's transformers backend may fuse projections (`qkv_proj` = q, k, v stacked
  along dim 0; `gate_up_proj` = gate, up), and pads the vocabulary rows of the
  embedding and output head (to a multiple of 64). Sharing still works: the
  trainer's parts become consecutive row blocks of one buffer (`p.data =
  buffer[a:b]`, the Parameter objects and so any optimizer state stay the same),
  and the engine's parameter becomes the whole buffer; padding rows are zeros.
- When sharing is impossible (another dtype or device, a LoRA model whose
  vLLM weights are W + BA) the weights are copied; `fingerprint` then checks
  the copy bit for bit, on whichever device each side lives.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from grpo.lm.loading import is_peft_model

__all__ = [
    "FUSED_PROJECTIONS",
    "canonical_name",
    "copy_problems",
    "fingerprint",
    "map_parameters",
    "merged_lora_weight",
    "parameter_fingerprints",
    "parameter_layout",
    "share_parameters",
    "sharing_problems",
    "storage_problems",
    "trainer_weights",
]

FUSED_PROJECTIONS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""Engine module name -> the trainer's modules stacked along dim 0, in order."""
WRAPPER_PREFIXES = ("base_model.model.", "model.", "language_model.")
"""Leading name components that only say which wrapper holds the network."""
_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 22  # elements fingerprinted at a time, to bound the int64 temporaries

Mapping_ = dict[str, tuple[str, ...]]  # engine name -> trainer names, stacked along dim 0


def canonical_name(name: str) -> str:
    """The name with wrapper prefixes and PEFT's ".base_layer" removed, for comparison."""
    name = name.replace(".base_layer.", ".")
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    return name


def _fused_parts(name: str, trainer_by_name: Mapping[str, str]) -> tuple[str, ...] | None:
    """The trainer names stacked into a fused engine parameter, if all of them exist."""
    components = name.split(".")
    for i, component in enumerate(components):
        if component in FUSED_PROJECTIONS:
            parts = [
                ".".join([*components[:i], part, *components[i + 1 :]])
                for part in FUSED_PROJECTIONS[component]
            ]
            if all(part in trainer_by_name for part in parts):
                return tuple(trainer_by_name[part] for part in parts)
    return None


def map_parameters(engine_names: Iterable[str], trainer: Mapping[str, Tensor]) -> Mapping_:
    """engine name -> the trainer names whose tensors, stacked along dim 0, it holds.

    Raises ValueError naming every engine parameter with no trainer counterpart,
    every ambiguous one, and every trainer tensor the engine has no place for
    (a tied alias of a mapped tensor is not missing).
    """
    by_canonical: dict[str, list[str]] = {}
    for name in trainer:
        by_canonical.setdefault(canonical_name(name), []).append(name)
    unique = {c: names[0] for c, names in by_canonical.items() if len(names) == 1}
    mapping: Mapping_ = {}
    problems = []
    for name in engine_names:
        key = canonical_name(name)
        if len(by_canonical.get(key, ())) > 1:
            problems.append(f"{name} matches several trainer tensors {by_canonical[key]}")
        elif key in unique:
            mapping[name] = (unique[key],)
        elif (parts := _fused_parts(key, unique)) is not None:
            mapping[name] = parts
        else:
            problems.append(f"{name} has no trainer counterpart")
    used = {_identity(trainer[n]) for parts in mapping.values() for n in parts}
    uncovered = [n for n, t in trainer.items() if _identity(t) not in used]
    problems += [f"trainer tensor {n} has no engine counterpart" for n in uncovered]
    if problems:
        sample = ", ".join(list(trainer)[:3])
        raise ValueError(
            "cannot match the engine's parameters with the trainer's (trainer names look like "
            f"{sample}): " + "; ".join(problems)
        )
    return mapping


def _identity(t: Tensor) -> tuple[int, tuple[int, ...]]:
    """Tensors with the same storage and shape are one tensor (tied weights)."""
    return t.data_ptr(), tuple(t.shape)


def _rows(t: Tensor | tuple[int, ...]) -> int:
    shape = tuple(t.shape) if isinstance(t, Tensor) else t
    return shape[0] if shape else 1


def sharing_problems(
    engine: Mapping[str, Tensor], trainer: Mapping[str, Tensor], mapping: Mapping_
) -> list[str]:
    """Why the engine cannot compute with the trainer's storage; [] = it can."""
    problems = []
    for name, parts in mapping.items():
        e, ts = engine[name], [trainer[n] for n in parts]
        stacked = ts[0].dim() > 0 and sum(_rows(t) for t in ts) <= _rows(e)
        if any(t.dtype != e.dtype for t in ts):
            problems.append(f"{name}: dtype {e.dtype} in the engine, {ts[0].dtype} in the trainer")
        elif any(t.device != e.device for t in ts):
            problems.append(f"{name}: on {e.device} in the engine, {ts[0].device} in the trainer")
        elif not (
            (len(ts) == 1 and ts[0].shape == e.shape)
            or (stacked and all(t.shape[1:] == e.shape[1:] for t in ts))
        ):
            shapes = " + ".join(str(tuple(t.shape)) for t in ts)
            problems.append(
                f"{name}: shape {tuple(e.shape)} in the engine, {shapes} in the trainer"
            )
    return problems


@torch.no_grad()
def share_parameters(
    engine: Mapping[str, Tensor], trainer: Mapping[str, Tensor], mapping: Mapping_
) -> None:
    """Make every engine parameter compute with the trainer's storage (no copy from then on).

    The trainer's values are kept; the engine's are discarded. Raises ValueError
    listing `sharing_problems` when sharing is impossible.
    """
    problems = sharing_problems(engine, trainer, mapping)
    if problems:
        raise ValueError("cannot share weights: " + "; ".join(problems))
    for name, parts in mapping.items():
        e = engine[name]
        e.data = _shared_buffer([trainer[n] for n in parts], _rows(e))


def _shared_buffer(parts: list[Tensor], rows: int) -> Tensor:
    """A tensor of `rows` rows whose leading row blocks are `parts` (re-pointed at it)."""
    if len(parts) == 1 and (parts[0].dim() == 0 or _rows(parts[0]) == rows):
        return parts[0].data
    shape = (rows, *parts[0].shape[1:])
    existing = _stacked_base(parts, shape)
    if existing is not None:  # already stacked (e.g. a tied head shared a second time)
        return existing
    buffer = parts[0].new_zeros(shape)  # padding rows stay 0
    offset = 0
    for p in parts:
        n = _rows(p)
        buffer[offset : offset + n].copy_(p.data)
        p.data = buffer[offset : offset + n]  # same Parameter object, new storage
        offset += n
    return buffer


def _stacked_base(parts: list[Tensor], shape: tuple[int, ...]) -> Tensor | None:
    """The buffer `parts` already are consecutive row blocks of, if exactly `shape`."""
    first = parts[0].data
    if first.storage_offset() != 0 or not all(p.is_contiguous() for p in parts):
        return None
    row_bytes = first[0].numel() * first.element_size()
    offset = 0
    for p in parts:
        if p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
            return None
        if p.data_ptr() != first.data_ptr() + offset * row_bytes:
            return None
        offset += _rows(p)
    if first.untyped_storage().nbytes() != shape[0] * row_bytes:
        return None
    return first.as_strided(shape, torch.empty(shape, device="meta").stride(), 0)


def parameter_layout(model: nn.Module) -> dict[str, tuple[int, tuple[int, ...]]]:
    """name -> (data pointer, shape) of every parameter (tied names included)."""
    return {
        name: (p.data_ptr(), tuple(p.shape))
        for name, p in model.named_parameters(remove_duplicate=False)
    }


def storage_problems(
    layout: Mapping[str, tuple[int, tuple[int, ...]]],
    trainer: Mapping[str, Tensor],
    mapping: Mapping_,
) -> list[str]:
    """Where the engine's parameters (their `parameter_layout`) are not the trainer's storage."""
    problems = []
    for name, parts in mapping.items():
        if name not in layout:
            problems.append(f"{name}: no longer a parameter of the engine")
            continue
        ptr, shape = layout[name]
        ts = [trainer[n] for n in parts]
        row_bytes = ts[0][0].numel() * ts[0].element_size() if ts[0].dim() else 0
        offset = 0
        for n, t in zip(parts, ts, strict=True):
            if t.data_ptr() != ptr + offset * row_bytes:
                problems.append(f"{name}: the engine does not compute with the trainer's {n}")
                break
            offset += _rows(t)
        else:
            if len(ts) > 1 and not all(t.is_contiguous() for t in ts):
                problems.append(f"{name}: the trainer's parts are no longer contiguous rows")
            elif tuple(shape[1:]) != tuple(ts[0].shape[1:]) or _rows(shape) < offset:
                problems.append(
                    f"{name}: shape {shape} in the engine, {tuple(ts[0].shape)} in the trainer"
                )
    return problems


@torch.no_grad()
def fingerprint(tensor: Tensor) -> int:
    """An exact, order-sensitive 64-bit fingerprint of a tensor's bits (any device).

    Σ_i bits_i · (2i + 1) mod 2^64 over the flattened tensor: integer arithmetic, so
    the same on CPU and GPU whatever the reduction order; every weight is odd, so
    a change to any single element always changes it.
    """
    flat = tensor.detach().contiguous().view(-1)
    bits = flat.view(_INT_VIEWS[flat.element_size()])
    total = 0
    for start in range(0, bits.numel(), _CHUNK):
        chunk = bits[start : start + _CHUNK].long()
        odd = torch.arange(start, start + chunk.numel(), device=chunk.device) * 2 + 1
        total += int((chunk * odd).sum())  # int64 sums wrap: exact modulo 2^64
    return total % (1 << 64)


def parameter_fingerprints(model: nn.Module, rows: Mapping[str, int]) -> dict[str, int]:
    """name -> fingerprint of the parameter's first `rows[name]` rows (padding rows left out)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return {
        n: fingerprint(params[n][:r] if params[n].dim() else params[n]) for n, r in rows.items()
    }


def copy_problems(
    engine_fingerprints: Mapping[str, int],
    trainer: Mapping[str, Tensor],
    mapping: Mapping_,
    dtype: torch.dtype,
) -> list[str]:
    """Which engine parameters differ from the trainer's tensors cast to the engine's dtype."""
    problems = []
    for name, parts in mapping.items():
        with torch.no_grad():
            expected = (
                torch.cat([trainer[n].to(dtype) for n in parts])
                if len(parts) > 1
                else trainer[parts[0]].to(dtype)
            )
        if engine_fingerprints.get(name) != fingerprint(expected):
            problems.append(
                f"{name}: the engine's copy differs from the trainer's {', '.join(parts)}"
            )
    return problems


def expected_rows(trainer: Mapping[str, Tensor], mapping: Mapping_) -> dict[str, int]:
    """engine name -> rows of its trainer tensors stacked (what a copy check compares)."""
    return {name: sum(_rows(trainer[n]) for n in parts) for name, parts in mapping.items()}


def trainer_weights(model: nn.Module) -> dict[str, Tensor]:
    """The weights the engine should hold, by checkpoint name (tied aliases included).

    A plain model gives its own Parameters (they can be shared); a PEFT model gives
    W + ΔW for every adapted layer (fresh tensors: they can only be copied).
    """
    if is_peft_model(model):
        return merged_lora_weights(model)
    return dict(model.named_parameters(remove_duplicate=False))


def _checkpoint_name(name: str) -> str:
    """A PEFT parameter name as the base model's checkpoint spells it."""
    name = name.replace(".base_layer.", ".")
    return re.sub(r"\.modules_to_save\.[^.]+\.", ".", name)


@torch.no_grad()
def merged_lora_weights(model: Any) -> dict[str, Tensor]:
    """Base weights with every active LoRA adapter added (W + ΔW), by checkpoint name."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    weights = {
        _checkpoint_name(name): p.detach()
        for name, p in base.named_parameters(remove_duplicate=False)
        if ".lora_" not in name and ".original_module." not in name
    }
    for module_name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weights[_checkpoint_name(f"{module_name}.weight")] = merged_lora_weight(module)
    return weights


def merged_lora_weight(layer: Any) -> Tensor:
    """A peft LoRA layer's (linear or embedding) base weight plus the ΔW of every active
    adapter its forward adds and the weight does not already hold (none once merged); the
    base weight itself when there is none. Call without gradient."""
    weight = layer.base_layer.weight.detach()
    if getattr(layer, "merged", False):
        return weight
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A or adapter in layer.lora_embedding_A:
            weight = weight + layer.get_delta_weight(adapter)
    return weight
