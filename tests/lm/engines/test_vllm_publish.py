"""Publishing weight versions for vLLM servers: atomic folders, aliases, pruning, free space."""

import os

import pytest
import torch
from safetensors.torch import load_file

from grpo.lm.engines import vllm_publish
from grpo.lm.engines.vllm_publish import (
    free_space_problem,
    prune_versions,
    publish_weights,
    separate_tensors,
)


def _weights():
    embed = torch.arange(12.0).reshape(4, 3)
    return {"embed.weight": embed, "head.weight": embed, "norm.weight": torch.ones(3)}


def test_published_version_holds_every_name_with_its_values(tmp_path):
    """One folder per version with model.safetensors only; tied names each get the values."""
    path = publish_weights(tmp_path, "a-000001", _weights())
    assert path == tmp_path / "weights-a-000001"
    assert sorted(os.listdir(path)) == ["model.safetensors"]
    loaded = load_file(path / "model.safetensors")
    assert loaded.keys() == _weights().keys()
    for name, tensor in _weights().items():
        assert torch.equal(loaded[name], tensor)
    assert [p.name for p in tmp_path.iterdir()] == ["weights-a-000001"]  # no partial left


def test_aliases_become_separate_copies_and_others_stay_shared():
    """A second name of one storage is copied (safetensors refuses aliases); the first is not."""
    weights = _weights()
    out = separate_tensors(weights)
    assert out["embed.weight"].data_ptr() == weights["embed.weight"].data_ptr()
    assert out["head.weight"].data_ptr() != weights["embed.weight"].data_ptr()


def test_a_failed_write_leaves_no_version_folder(tmp_path, monkeypatch):
    """A crash while writing leaves neither the version nor its partial folder."""

    def broken(tensors, path):
        raise OSError("disk gone")

    monkeypatch.setattr(vllm_publish, "save_file", broken)
    with pytest.raises(OSError, match="disk gone"):
        publish_weights(tmp_path, "b-1", _weights())
    assert list(tmp_path.iterdir()) == []


def test_prune_keeps_the_newest_versions_only(tmp_path):
    """Only `keep` newest weights-* folders remain; other files and folders are untouched."""
    for i in range(4):
        publish_weights(tmp_path, f"r-{i}", _weights())
        os.utime(tmp_path / f"weights-r-{i}", ns=(i * 10**9, i * 10**9))
    (tmp_path / "notes").mkdir()
    deleted = prune_versions(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["weights-r-0", "weights-r-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "weights-r-2", "weights-r-3"]


def test_free_space_is_checked_before_writing(tmp_path, monkeypatch):
    """Too little free space: an OSError naming the folder and the sizes; nothing written."""
    assert free_space_problem(tmp_path, 1) is None
    usage = type("usage", (), {"free": 10 << 20})
    monkeypatch.setattr(vllm_publish.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(OSError, match=f"{tmp_path} has 10 MiB free"):
        publish_weights(tmp_path, "c-1", _weights())
    assert list(tmp_path.iterdir()) == []
