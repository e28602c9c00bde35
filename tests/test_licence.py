"""`grpo.licence`: the licence files a model folder declares, and what a saved folder carries."""

from __future__ import annotations

import json

import pytest

from grpo.licence import ModelLicence, licence_files, read_licence, write_licence

LICENCE = ModelLicence(
    "gemma", "ai.google.dev/gemma/terms",
    {"NOTICE": b"the notice\n", "TERMS.html": b"<p>terms</p>"}, ("Dequantized.",),
)  # fmt: skip


def test_a_folder_without_a_declaration_declares_nothing(tmp_path):
    """No licence.json: None (a plain folder, or a path that is not a folder at all)."""
    assert read_licence(tmp_path) is None and read_licence(tmp_path / "absent") is None


def test_a_saved_folder_carries_the_files_and_one_more_modification(tmp_path):
    """Written then read back: the same files, the modifications in order with the new one
    last, and MODIFIED.md listing them all."""
    write_licence(LICENCE, tmp_path, "Trained.")
    again = read_licence(tmp_path)
    assert again == ModelLicence(
        LICENCE.licence, LICENCE.url, LICENCE.files, ("Dequantized.", "Trained.")
    )
    note = (tmp_path / "MODIFIED.md").read_text()
    assert "1. Dequantized.\n2. Trained.\n" in note and "NOTICE, TERMS.html" in note
    (tmp_path / "copy").mkdir()
    write_licence(again, tmp_path / "copy", "Trained again.")
    assert read_licence(tmp_path / "copy").modifications == (
        "Dequantized.",
        "Trained.",
        "Trained again.",
    )


def test_no_licence_writes_nothing(tmp_path):
    """A model without declared files saves without any licence file."""
    write_licence(None, tmp_path, "Trained.")
    assert list(tmp_path.iterdir()) == []


def test_a_declared_file_that_is_missing_is_named(tmp_path):
    """The weights may not travel without their licence files: the missing one is named."""
    for name, content in licence_files(LICENCE, "Trained.").items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "TERMS.html").unlink()
    with pytest.raises(ValueError, match="declares 'TERMS.html', which is missing"):
        read_licence(tmp_path)


@pytest.mark.parametrize(
    "declared",
    [b"{not json", b"[]", b'{"licence": "x", "url": "u", "files": []}',
     b'{"licence": "x", "url": "u", "files": ["NOTICE"], "modifications": "none"}'],
)  # fmt: skip
def test_a_malformed_declaration_is_refused_with_its_path(tmp_path, declared):
    """Unreadable JSON, another shape, no files, or modifications not a list: a ValueError
    naming licence.json."""
    (tmp_path / "NOTICE").write_text("n")
    (tmp_path / "licence.json").write_bytes(declared)
    with pytest.raises(ValueError, match="licence.json"):
        read_licence(tmp_path)


@pytest.mark.parametrize("name", ["../NOTICE", "licence.json", "MODIFIED.md"])
def test_a_declared_name_must_be_a_plain_file_of_its_own(tmp_path, name):
    """A declared file may not point outside the folder or be one of the files written here."""
    (tmp_path / "licence.json").write_text(
        json.dumps({"licence": "x", "url": "u", "files": [name]})
    )
    with pytest.raises(ValueError, match="not a plain file name of its own"):
        read_licence(tmp_path)


def test_task_parts_of_your_own_take_the_policys_licence():
    """A task factory that builds TaskParts without `licence` still gets its checkpoints the
    policy's licence files; one that passes its own keeps it; a policy without one, None."""
    from types import SimpleNamespace

    from grpo.run.parts import TaskParts

    other = ModelLicence("other", "example.org", {"NOTICE": b"other\n"}, ())
    assert TaskParts(SimpleNamespace(licence=LICENCE), None, []).licence is LICENCE
    assert TaskParts(SimpleNamespace(licence=LICENCE), None, [], licence=other).licence is other
    assert TaskParts(SimpleNamespace(), None, []).licence is None
