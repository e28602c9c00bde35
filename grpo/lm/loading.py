"""Loading, LoRA-wrapping and saving the transformers model behind `CausalLMPolicy`.

- A local path that does not exist fails at once with `FileNotFoundError`
  (no attempt to reach a model hub); other load failures are re-raised with
  the path named.
- A tokenizer without a pad token gets `pad = eos`, with a warning: padding is
  always masked out, and a completion ends at its first EOS, so pad == eos is
  harmless here.
- `freeze_parameters` keeps the parameters whose names match a pattern as loaded (no
  gradient, no optimizer state): a tied embedding and output layer freeze together.
- LoRA uses PEFT (the `lora` extra). Saving writes safetensors that plain
  transformers (or PEFT for an adapter) loads; `merged=True` also writes the
  adapter folded into a copy of the base weights.
- A model folder that declares licence files (`licence.json`, `grpo.licence`)
  passes them on: every folder saved from a model loaded from it carries them,
  with MODIFIED.md saying the weights were trained.
"""

from __future__ import annotations

import copy
import fnmatch
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo.licence import TRAINED, ModelLicence, read_licence, write_licence

__all__ = [
    "DTYPES",
    "LoraSettings",
    "apply_lora",
    "ensure_pad_token",
    "freeze_parameters",
    "is_peft_model",
    "load_model_and_tokenizer",
    "save_model",
    "source_licence",
]

DTYPES = {
    "auto": "auto",
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class LoraSettings:
    """Low-rank adapters (Hu et al. 2021) trained instead of the full weights."""

    r: int = 16
    """Rank of each adapter."""
    alpha: float = 32.0
    """Scaling numerator: the update is (alpha / r) * B A."""
    dropout: float = 0.0
    """Dropout on the adapter input, in [0, 1)."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Module names to adapt, or "all-linear" (every linear layer but the output head)."""

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"r: got {self.r!r}; allowed: an integer >= 1")
        if (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, (int, float))
            or self.alpha <= 0
        ):
            raise ValueError(f"alpha: got {self.alpha!r}; allowed: a number > 0")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout: got {self.dropout!r}; allowed: a number in [0, 1)")
        if not isinstance(self.target_modules, str):
            self.target_modules = tuple(self.target_modules)
            if not self.target_modules:
                raise ValueError(
                    "target_modules: got an empty list; allowed: names or 'all-linear'"
                )


def _looks_local(path: str) -> bool:
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def load_model_and_tokenizer(
    path: str | os.PathLike, *, dtype: str = "auto", device: str | torch.device | None = None
) -> tuple[Any, Any]:
    """`AutoModelForCausalLM` and `AutoTokenizer` from one folder (or hub id)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.expanduser(os.fspath(path))  # a config may say ~/...
    if dtype not in DTYPES:
        raise ValueError(f"dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
    if _looks_local(path) and not Path(path).expanduser().exists():
        raise FileNotFoundError(
            f"model path {path!r} does not exist; give a folder written by save_pretrained"
        )
    if _looks_local(path) or os.path.exists(path):  # transformers reads an existing path locally
        _check_folder(Path(path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except OSError as err:
        raise OSError(f"could not load a causal LM and tokenizer from {path!r}: {err}") from err
    if device is not None:
        model.to(device)
    ensure_pad_token(tokenizer)
    return model, tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
"""One of these makes a folder's tokenizer loadable (a fast, sentencepiece or BPE tokenizer)."""
CONFIG_FILES = ("config.json", "adapter_config.json")
"""One of these makes a folder's model loadable: a model's config, or a LoRA adapter's (the
`final/` of a LoRA run), which names its base model."""


def _check_folder(folder: Path) -> None:
    """A local model folder without a config (`CONFIG_FILES`) or any tokenizer file: one
    FileNotFoundError naming what is missing, before transformers' longer messages."""
    if not folder.is_dir():
        raise FileNotFoundError(f"model path {str(folder)!r} is a file; give the folder "
                                "save_pretrained wrote")  # fmt: skip
    has_config = any((folder / name).is_file() for name in CONFIG_FILES)
    missing = [] if has_config else ["config.json (nor a LoRA adapter's adapter_config.json)"]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer file (one of {', '.join(TOKENIZER_FILES)})")
    if missing:
        raise FileNotFoundError(f"model path {str(folder)!r} has no {' and no '.join(missing)}; "
                                "give a folder written by save_pretrained (model and tokenizer)")


def ensure_pad_token(tokenizer: Any) -> None:
    """Set pad = eos (with a warning) when the tokenizer has no pad token."""
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token is None:
        raise ValueError("tokenizer has neither a pad token nor an EOS token; set one of them")
    warnings.warn(
        f"tokenizer has no pad token; using its EOS token {tokenizer.eos_token!r} for padding",
        UserWarning,
        stacklevel=3,
    )
    tokenizer.pad_token = tokenizer.eos_token


def is_peft_model(model: Any) -> bool:
    """True for a PEFT-wrapped model (without importing peft when it is absent)."""
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """Wrap `model` with trainable LoRA adapters; the base weights are frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:  # pragma: no cover - peft is in the dev extra
        raise ImportError("LoRA needs peft: pip install 'grpo[lora]'") from err
    target = settings.target_modules
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def freeze_parameters(model: torch.nn.Module, patterns: tuple[str, ...], field: str) -> int:
    """Stop training every parameter whose name (as `named_parameters` gives it, so a tied
    weight once) matches one of the shell-style `patterns`; returns how many elements froze.
    A pattern that matches no parameter is a ValueError naming `field`."""
    names = [name for name, _ in model.named_parameters()]
    frozen = 0
    for pattern in patterns:
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            shown = ", ".join(names[:4])
            raise ValueError(f"{field}: {pattern!r} matches no parameter; names look like {shown}")
    for name, param in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def source_licence(model: Any) -> ModelLicence | None:
    """The licence files declared by the local folder `model` was loaded from, if any."""
    source = getattr(model, "name_or_path", None) or ""
    return read_licence(source) if source and Path(source).expanduser().is_dir() else None


def save_model(
    model: Any,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    merged: bool = False,
    licence: ModelLicence | None = None,
) -> Path:
    """save_pretrained (safetensors) the model or adapter and the tokenizer to `path`, with
    `licence`'s files and the note that the weights were trained (`TRAINED`).

    With a PEFT model, `path` gets the adapter and, when `merged`, `path/merged`
    gets full weights with the adapter folded in (from a copy: the live model
    keeps its adapter).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    write_licence(licence, path, TRAINED)
    if merged and is_peft_model(model):
        full = copy.deepcopy(model).merge_and_unload()
        full.save_pretrained(path / "merged", safe_serialization=True)
        tokenizer.save_pretrained(path / "merged")
        write_licence(licence, path / "merged", TRAINED)
    return path
