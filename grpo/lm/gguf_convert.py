"""A GGUF file to an ordinary Hugging Face folder, checked against the file it came from.

transformers reads a GGUF file (with the `gguf` package, the `gguf` extra) and
dequantizes it to float32, but the object it returns refuses `save_pretrained`.
`convert_gguf` copies its weights into a plain model built from the same config
(without the GGUF quantization entry) and writes

- `model.safetensors`, `config.json` (with every pinned value written out:
  `grpo.lm.gguf_pins`), the tokenizer files and the chat template, if any;
- `generation_config.json` with no sampling knobs (greedy unless the caller asks
  otherwise) and `eos_token_id` set to the token generation ends with;
- `conversion.json`: the source, the pins, the probe results and the SHA-256 of
  every file, which `check_folder` verifies later without touching the source again.

The check before the folder is published (it is written under `NAME.partial` and
renamed only when the check passes): the probe (a chat through the chat template,
or a plain prompt for a base model) tokenizes the same with the saved tokenizer as
with the GGUF one; the saved config states every pinned value; the saved model's
logits on the probe equal the GGUF-loaded model's to `LOGIT_TOLERANCE`; and its
greedy answer reaches the end-of-turn token (or the probe's stop string) within
`max_new_tokens`. torch and transformers are imported only when a conversion runs:
checking a cached folder needs neither.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOGIT_TOLERANCE",
    "MANIFEST",
    "ConversionError",
    "Probe",
    "check_folder",
    "convert_gguf",
    "sha256_file",
]

MANIFEST = "conversion.json"
LOGIT_TOLERANCE = 1e-5
"""Largest absolute logit difference allowed; the same weights in the same class give 0."""


class ConversionError(RuntimeError):
    """The converted folder does not behave like the GGUF file, or a cached folder was altered."""


@dataclass(frozen=True)
class Probe:
    """The prompt both models answer before a folder is published: chat messages answered up
    to the end-of-turn token, or, for a base model (no chat template, turn tokens untrained),
    a plain prompt answered up to a stop string."""

    messages: tuple[dict[str, str], ...] = (
        {"role": "user", "content": "What is 2 + 3? Answer with a number."},
    )
    """Chat messages, rendered with the model's chat template and a generation prompt; used
    when `prompt` is None."""
    prompt: str | None = None
    """A plain text prompt, tokenized as it is (the tokenizer adds its BOS, if it has one)."""
    stop: str | None = None
    """Text the greedy answer must reach (e.g. "\\n"), in place of the end-of-turn token."""
    max_new_tokens: int = 48
    """The greedy answer must reach its end (the token, or `stop`) within this many tokens."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "reading a GGUF file needs the gguf package: pip install 'grpo[gguf]'"
        ) from err


def _load_gguf(gguf_path: Path, pins: Mapping[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """transformers' GGUF loader: the dequantized float32 model, built from the file's config
    with `pins` set, its tokenizer, and what each pin replaced."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from grpo.lm.gguf_pins import gguf_metadata, pin_config

    _require_gguf()
    where = {"pretrained_model_name_or_path": str(gguf_path.parent), "gguf_file": gguf_path.name}
    config = AutoConfig.from_pretrained(**where)
    pinned = pin_config(config, pins, gguf_metadata(gguf_path)) if pins else {}
    tokenizer = AutoTokenizer.from_pretrained(**where)
    model = AutoModelForCausalLM.from_pretrained(**where, config=config, dtype=torch.float32)
    return model.eval(), tokenizer, pinned


def _plain_copy(model: Any, eos_id: int) -> Any:
    """The same weights in a model built from the config alone, which `save_pretrained` accepts."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = copy.deepcopy(model.config)
    for name in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, name):
            delattr(config, name)
    config.eos_token_id = eos_id
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    # Only token ids: a generation config with sampling knobs would override what callers ask.
    plain.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos_id, pad_token_id=config.pad_token_id
    )
    return plain.eval()


def _probe_ids(tokenizer: Any, probe: Probe) -> torch.Tensor:
    if probe.prompt is not None:
        return tokenizer(probe.prompt, return_tensors="pt")["input_ids"]  # (1, P)
    encoded = tokenizer.apply_chat_template(
        list(probe.messages), add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return encoded["input_ids"]  # (1, P)


def _answer_end(tokenizer: Any, answer: list[int], eos_id: int, probe: Probe) -> int:
    """How many of the greedy `answer`'s tokens reach its end: the end-of-turn token, or the
    first token whose text completes `probe.stop`."""
    if probe.stop is None:
        if eos_id in answer:
            return answer.index(eos_id) + 1
        end = repr(tokenizer.convert_ids_to_tokens(eos_id))
    else:
        for n in range(1, len(answer) + 1):
            if probe.stop in tokenizer.decode(answer[:n]):
                return n
        end = f"the stop string {probe.stop!r}"
    raise ConversionError(
        f"the greedy probe answer did not end with {end} within {probe.max_new_tokens} tokens: "
        f"{tokenizer.decode(answer)!r}"
    )


def _check_saved(folder: Path, ref_ids: torch.Tensor, ref_logits: torch.Tensor,
                 eos_id: int, probe: Probe, pins: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Reload `folder` as a user would and compare it with the GGUF model's probe results."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.lm.gguf_pins import check_pins

    check_pins(folder, pins)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = _probe_ids(tokenizer, probe)
    if not torch.equal(ids, ref_ids):
        raise ConversionError(
            f"the saved tokenizer encodes the probe differently from the GGUF one: "
            f"{ids.tolist()} != {ref_ids.tolist()}"
        )
    with torch.no_grad():
        diff = (model(ids).logits - ref_logits).abs().max().item()
    if not diff <= LOGIT_TOLERANCE:
        raise ConversionError(
            f"the saved model's logits differ from the GGUF model's by {diff:.3g} "
            f"(allowed {LOGIT_TOLERANCE})"
        )
    out = model.generate(ids, attention_mask=torch.ones_like(ids),
                         max_new_tokens=probe.max_new_tokens, do_sample=False)  # fmt: skip
    answer = out[0, ids.shape[1] :].tolist()
    answer = answer[: _answer_end(tokenizer, answer, eos_id, probe)]
    asked = {"messages": list(probe.messages)} if probe.prompt is None else {"prompt": probe.prompt}
    return {
        **asked,
        "prompt_tokens": ids.shape[1],
        "max_abs_logit_difference": diff,
        "logit_tolerance": LOGIT_TOLERANCE,
        "greedy_answer": tokenizer.decode(answer),
        "greedy_answer_tokens": len(answer),
        **({"ends_with_eos": True} if probe.stop is None else {"reaches_stop": probe.stop}),
    }


def convert_gguf(gguf_path: Path, folder: Path, *, eos_token: str, probe: Probe = Probe(),
                 pins: Mapping[str, Any] | None = None, source: dict[str, Any] | None = None,
                 extra_files: dict[str, bytes] | None = None) -> dict[str, Any]:  # fmt: skip
    """Convert `gguf_path` into `folder` (replaced if present), check it, return its manifest.

    `eos_token` is the token generation ends with (a chat turn's end, or a base model's EOS);
    `pins` (config field -> value) are set and written out in place of transformers' reading
    (`grpo.lm.gguf_pins`); `source` is recorded in the manifest; `extra_files`
    (name -> content) are written beside the weights, e.g. a licence. On any failure the
    partly written `NAME.partial` folder is removed and `folder` is left as it was.
    """
    pins = dict(pins or {})
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        manifest = _convert_into(partial, gguf_path, eos_token, probe, pins, source, extra_files)
    except BaseException:  # a failed check or an interruption leaves no half-written folder
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return manifest


def _convert_into(partial: Path, gguf_path: Path, eos_token: str, probe: Probe,
                  pins: dict[str, Any], source: dict[str, Any] | None,
                  extra_files: dict[str, bytes] | None) -> dict[str, Any]:  # fmt: skip
    """`convert_gguf`'s work, written into `partial` and checked there: the manifest."""
    import torch

    from grpo.lm.gguf_pins import write_pins

    model, tokenizer, pinned = _load_gguf(gguf_path, pins)
    eos_id = tokenizer.convert_tokens_to_ids(eos_token)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise ConversionError(f"eos_token {eos_token!r} is not in the GGUF file's vocabulary")
    tokenizer.eos_token = eos_token
    ref_ids = _probe_ids(tokenizer, probe)
    with torch.no_grad():
        ref_logits = model(ref_ids).logits  # (1, P, V)
    plain = _plain_copy(model, eos_id)
    del model
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    del plain
    if pins:
        write_pins(partial / "config.json", pins)
    for name, content in (extra_files or {}).items():
        (partial / name).write_bytes(content)
    probe_result = _check_saved(partial, ref_ids, ref_logits, eos_id, probe, pins)
    manifest = _manifest(partial, gguf_path, source or {}, probe_result, pinned)
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _manifest(folder: Path, gguf_path: Path, source: dict[str, Any], probe: dict[str, Any],
              pinned: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    import gguf
    import torch
    import transformers

    return {
        "source": {**source, "gguf_file": gguf_path.name, "gguf_sha256": sha256_file(gguf_path)},
        "converted_with": {"transformers": transformers.__version__,
                           "gguf": _version("gguf", gguf), "torch": torch.__version__},  # fmt: skip
        **({"pins": pinned} if pinned else {}),
        "probe": probe,
        "files": {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()},
    }


def _version(name: str, module: Any) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def check_folder(folder: Path, required: Sequence[str] = ()) -> dict[str, Any]:
    """The manifest of a converted folder whose files still hash as recorded; `ConversionError`
    names the first file that is missing or changed."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ConversionError(f"{folder} has no {MANIFEST}: not a finished conversion")
    try:
        manifest = json.loads(path.read_bytes())
    except ValueError as err:  # cut short or not text (a crash mid-write): UnicodeDecodeError too
        raise ConversionError(f"{path} is not readable JSON ({err})") from err
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ConversionError(f"{path} has no table of file hashes (\"files\": name -> sha256)")
    for name in (*required, *files):
        if not (folder / name).is_file():
            raise ConversionError(f"{folder / name} is missing")
        if name in files and sha256_file(folder / name) != files[name]:
            raise ConversionError(f"{folder / name} changed since it was converted")
    return manifest

