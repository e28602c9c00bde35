"""The licence files a model folder declares, carried into every folder saved from it.

Some weights may be shared only with their licence files beside them and a
notice in every modified copy (the Gemma Terms of Use, section 3.1, and
Apache-2.0, section 4, ask for both). A model folder declares such files in
`licence.json`:

    {"licence": "gemma", "url": "ai.google.dev/gemma/terms",
     "files": ["NOTICE", "GEMMA_TERMS.html", "USE_RESTRICTIONS.md"],
     "modifications": ["Dequantized from Q4_K_M to float32 ... by grpo fetch."]}

`read_licence` reads the declaration and the declared files' bytes when the
model loads; `licence_files` gives what a saved folder must hold: the same
files, the declaration with one more modification appended, and `MODIFIED.md`,
the notice listing every modification so far. Nothing here knows any
particular licence: a folder without `licence.json` declares nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LICENCE_MANIFEST",
    "MODIFIED_NOTE",
    "TRAINED",
    "ModelLicence",
    "licence_files",
    "read_licence",
    "write_licence",
]

LICENCE_MANIFEST = "licence.json"
MODIFIED_NOTE = "MODIFIED.md"
TRAINED = "Trained further with GRPO by grpo."
"""The modification a folder saved from a training run records (a policy or a checkpoint)."""


@dataclass(frozen=True)
class ModelLicence:
    """What a model folder's `licence.json` declares, with the declared files' contents."""

    licence: str
    """The licence's short name, e.g. "gemma" (a GGUF file's `general.license`)."""
    url: str
    """Where the licence's terms are published."""
    files: dict[str, bytes]
    """File name -> content: the files every folder saved from the model must carry."""
    modifications: tuple[str, ...] = ()
    """What was done to the weights since their release, oldest first, one sentence each."""


def read_licence(folder: str | os.PathLike) -> ModelLicence | None:
    """The licence `folder` declares, or None when it has no `licence.json` (or is not a local
    folder). A declaration that is malformed or names a missing file is a `ValueError`."""
    folder = Path(os.path.expanduser(os.fspath(folder)))
    path = folder / LICENCE_MANIFEST
    if not path.is_file():
        return None
    try:
        declared = json.loads(path.read_bytes())
    except ValueError as err:  # UnicodeDecodeError included
        raise ValueError(f"{path} is not readable JSON ({err})") from err
    declared = declared if isinstance(declared, dict) else {}
    names, done = declared.get("files"), declared.get("modifications", [])
    if not (all(isinstance(declared.get(key), str) for key in ("licence", "url"))
            and isinstance(names, list) and names and all(isinstance(n, str) for n in names)
            and isinstance(done, list) and all(isinstance(m, str) for m in done)):  # fmt: skip
        raise ValueError(
            f'{path}: expected {{"licence": str, "url": str, "files": [names], '
            f'"modifications": [sentences]}}'
        )
    files = {}
    for name in names:
        if Path(name).name != name or name in (LICENCE_MANIFEST, MODIFIED_NOTE):
            raise ValueError(f"{path}: files: {name!r} is not a plain file name of its own")
        if not (folder / name).is_file():
            raise ValueError(
                f"{path} declares {name!r}, which is missing from {folder}: the model's licence "
                "files must travel with its weights"
            )
        files[name] = (folder / name).read_bytes()
    return ModelLicence(declared["licence"], declared["url"], files, tuple(done))


def licence_files(licence: ModelLicence, modification: str) -> dict[str, bytes]:
    """File name -> content of a folder whose weights `modification` (one sentence) made from
    the model `licence` came with: the declared files, `licence.json`, `MODIFIED.md`."""
    done = [*licence.modifications, modification]
    declaration = {"licence": licence.licence, "url": licence.url, "files": list(licence.files),
                   "modifications": done}  # fmt: skip
    listed = "".join(f"{i}. {m}\n" for i, m in enumerate(done, 1))
    travel = "travels" if len(licence.files) == 1 else "travel"
    note = (
        "# Modified files\n\n"
        "The weights in this folder are not the original release. They were modified, in "
        f"this order:\n\n{listed}\n"
        f"They remain subject to their licence ({licence.licence}: {licence.url}); "
        f"{', '.join(licence.files)} {travel} with them and must be passed on with any copy.\n"
    )
    return {
        **licence.files,
        LICENCE_MANIFEST: (json.dumps(declaration, indent=2) + "\n").encode(),
        MODIFIED_NOTE: note.encode(),
    }


def write_licence(
    licence: ModelLicence | None, folder: str | os.PathLike, modification: str
) -> None:
    """Write `licence_files(licence, modification)` into `folder`; nothing when `licence` is None."""
    if licence is None:
        return
    for name, content in licence_files(licence, modification).items():
        (Path(folder) / name).write_bytes(content)
