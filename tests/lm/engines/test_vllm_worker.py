"""The servers' worker extension without vLLM: only folders inside the publish root are loaded."""

import os

import pytest

from grpo.lm.engines import vllm_worker
from grpo.lm.engines.vllm_worker import ROOT_ENV, WeightReloader, publish_root, reload_problem


class Worker(WeightReloader):
    """A worker whose vLLM reload only records the folders it was asked to load."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def reload_weights(self, weights_path: str) -> None:
        self.loaded.append(weights_path)


@pytest.fixture
def folders(tmp_path):
    """root/weights-a (a version), outside/ (safetensors, outside the root), root/link -> outside."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root / "weights-a", outside):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
    (root / "link").symlink_to(outside, target_is_directory=True)
    return root, outside


def test_only_absolute_folders_inside_the_root_are_accepted(folders):
    """Inside the root: accepted; outside, out through "..", through a link, relative, or with
    no root at all: refused, naming the root and GRPO_PUBLISH_ROOT."""
    root, outside = folders
    assert reload_problem(str(root / "weights-a"), root) is None
    for folder in (outside, root / ".." / "outside", root / "link"):
        problem = reload_problem(str(folder), root)
        assert f"outside this server's publish root {root} ({ROOT_ENV})" in problem
    assert "not an absolute path" in reload_problem("weights-a", root)
    assert f"started without {ROOT_ENV}" in reload_problem(str(root / "weights-a"), None)
    (root / "empty").mkdir()
    assert "no *.safetensors" in reload_problem(str(root / "empty"), root)


def test_a_refused_reload_loads_nothing_and_keeps_the_version(folders, monkeypatch):
    """grpo_reload outside the root raises before vLLM's reload runs; the held version stays;
    inside the root the resolved folder is loaded and its version recorded."""
    root, outside = folders
    monkeypatch.setattr(vllm_worker, "PUBLISH_ROOT", root)
    worker = Worker()
    assert worker.grpo_reload(str(root / "weights-a"), "v1") == {"version": "v1"}
    for folder in (outside, root / "link"):
        with pytest.raises(ValueError, match="grpo_reload refused: .* outside"):
            worker.grpo_reload(str(folder), "evil")
    assert worker.loaded == [str(root / "weights-a")]
    assert worker.grpo_version() == {"version": "v1"}
    assert worker.grpo_root() == {"root": str(root)}


def test_the_root_comes_from_the_environment_made_absolute(tmp_path, monkeypatch):
    """GRPO_PUBLISH_ROOT names the root (a relative one from the working folder); unset or
    empty: none."""
    monkeypatch.chdir(tmp_path)
    assert publish_root({ROOT_ENV: "weights"}) == tmp_path / "weights"
    assert publish_root({ROOT_ENV: str(tmp_path)}) == tmp_path
    assert publish_root({}) is None and publish_root({ROOT_ENV: ""}) is None
    assert os.path.isabs(publish_root({ROOT_ENV: "."}))
