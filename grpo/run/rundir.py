"""A run directory: everything one `grpo train` run writes, and where a resumed run restarts.

    RUN_DIR/
      config.yaml          the resolved config, every default filled in
      metrics.jsonl        one line per step and per evaluation
      samples.jsonl        prompts, completions and rewards at each evaluation
      tensorboard/         TensorBoard events (when tensorboard is installed)
      wandb/               W&B files (when asked)
      checkpoints/step-000050/state.pt, manifest.json (and the model's licence files)
      final/               the trained model in Hugging Face format
      training.png         reward, KL, completion length, time per step by phase
      summary.json         the first and last evaluations, steps and time

A checkpoint is written into a hidden `.step-N.partial/` folder (state file
fsync'ed, then a manifest with its size and SHA-256), and only then renamed
to `step-N/`: a run killed at any moment (kill -9 included) leaves complete
checkpoints and at most one partial folder, which is ignored and removed. On
resume every checkpoint's manifest is verified before loading; one that is
incomplete or corrupt is reported by name and the previous one is used. Log
lines written after the checkpoint a run resumes from are dropped, so the
resumed run's files read as if it had never stopped.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from grpo.checkpoint import atomic_save, atomic_write, fsync_dir
from grpo.licence import TRAINED, ModelLicence, write_licence
from grpo.run.metrics import scalar_metrics

__all__ = ["CHECKPOINT_FORMAT", "RunDirectory", "SamplesLogger", "read_checkpoint", "truncate_jsonl"]

CHECKPOINT_FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the rows of a JSONL log with "step" <= last_step (and drop a torn last line)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if row.get("step", 0) <= last_step:
            kept.append(line)
    text = "".join(line + "\n" for line in kept)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


class SamplesLogger:
    """Appends each evaluation's samples (prompt, completion, reward) to a JSONL file."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for sample in metrics.get("eval/samples") or ():
            self._file.write(json.dumps({"step": step, **sample}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class RunDirectory:
    """The files of one run (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.metrics = self.path / "metrics.jsonl"
        self.samples = self.path / "samples.jsonl"
        self.tensorboard = self.path / "tensorboard"
        self.checkpoints = self.path / "checkpoints"
        self.final = self.path / "final"
        self.plot = self.path / "training.png"
        self.summary = self.path / "summary.json"

    def check_unused(self) -> None:
        """Refuse a folder that holds anything already (a new run starts in an empty one)."""
        if self.path.exists() and any(self.path.iterdir()):
            raise FileExistsError(
                f"run.dir: {str(self.path)!r} already holds files; continue that run with "
                "--resume, or choose another run.dir"
            )

    def create(self, resolved_config: str) -> None:
        """Start a new run here; refuses a folder that holds anything already."""
        self.check_unused()
        self.path.mkdir(parents=True, exist_ok=True)
        self.config.write_text(resolved_config, encoding="utf-8")

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, state: dict[str, Any], keep: int,
                        licence: ModelLicence | None = None) -> Path:  # fmt: skip
        """Write `state` as checkpoint `step` (atomically, with a manifest) beside `licence`'s
        files, if any; keep the newest `keep`."""
        final = self.checkpoints / f"step-{step:06d}"
        partial = self.checkpoints / f".step-{step:06d}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        atomic_save(state, partial / "state.pt")
        write_licence(licence, partial, f"{TRAINED} state.pt holds the weights of step {step}.")
        state_file = partial / "state.pt"
        manifest = {
            "format_version": CHECKPOINT_FORMAT,
            "step": step,
            "files": {
                "state.pt": {"bytes": state_file.stat().st_size, "sha256": _sha256(state_file)}
            },
        }
        text = json.dumps(manifest, indent=2) + "\n"
        atomic_write(partial / "manifest.json", lambda f: f.write(text.encode("utf-8")))
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)  # the checkpoint exists, complete, from this instant
        fsync_dir(self.checkpoints)
        for old in self.complete_steps()[:-keep]:
            shutil.rmtree(self.checkpoints / f"step-{old:06d}", ignore_errors=True)
        return final

    def complete_steps(self) -> list[int]:
        """Steps of the checkpoint folders (not yet verified), oldest first."""
        if not self.checkpoints.is_dir():
            return []
        steps = [_STEP_DIR.match(p.name) for p in self.checkpoints.iterdir() if p.is_dir()]
        return sorted(int(m.group(1)) for m in steps if m)

    def verify(self, step: int) -> str | None:
        """None when checkpoint `step` is complete and intact, else what is wrong with it."""
        folder = self.checkpoints / f"step-{step:06d}"
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
            files = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return "incomplete: manifest.json is missing or unreadable"
        if manifest.get("format_version") != CHECKPOINT_FORMAT or manifest.get("step") != step:
            return "not a checkpoint of this format and step"
        for name, expected in files.items():
            path = folder / name
            if not path.is_file():
                return f"incomplete: {name} is missing"
            if path.stat().st_size != expected["bytes"]:
                return f"corrupt: {name} has {path.stat().st_size} bytes, the manifest says {expected['bytes']}"
            if _sha256(path) != expected["sha256"]:
                return f"corrupt: {name} does not match its SHA-256 in the manifest"
        return None

    def latest_checkpoint(self) -> tuple[int, dict[str, Any]] | None:
        """(step, state) of the newest intact checkpoint; broken ones are reported and skipped."""
        for partial in (
            self.checkpoints.glob(".step-*.partial") if self.checkpoints.is_dir() else ()
        ):
            shutil.rmtree(partial, ignore_errors=True)  # a save cut short
        for step in reversed(self.complete_steps()):
            problem = self.verify(step)
            if problem is None:
                path = self.checkpoints / f"step-{step:06d}" / "state.pt"
                return step, torch.load(path, map_location="cpu", weights_only=True)
            warnings.warn(
                f"checkpoint {self.checkpoints / f'step-{step:06d}'} is {problem}; "
                "using the previous checkpoint",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

    def truncate_logs(self, last_step: int) -> None:
        """Drop log lines written after `last_step` (they are re-written by the resumed run)."""
        truncate_jsonl(self.metrics, last_step)
        truncate_jsonl(self.samples, last_step)

    def write_summary(self, evaluations: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """First and last evaluation (scalars) plus `extra`, to summary.json; returns it."""
        summary = {
            "before": scalar_metrics(evaluations[0]) if evaluations else {},
            "after": scalar_metrics(evaluations[-1]) if evaluations else {},
            **extra,
        }
        text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
        atomic_write(self.summary, lambda f: f.write(text.encode("utf-8")))
        return summary


def read_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The state in checkpoint folder RUN_DIR/checkpoints/step-N, verified against its manifest;
    ValueError naming the folder when it is not one or is incomplete or corrupt."""
    folder = Path(folder)
    step = _STEP_DIR.match(folder.name)
    if step is None or folder.parent.name != "checkpoints":
        raise ValueError(f"{str(folder)!r} is not a checkpoint folder (RUN_DIR/checkpoints/step-N)")
    problem = RunDirectory(folder.parent.parent).verify(int(step.group(1)))
    if problem is not None:
        raise ValueError(f"checkpoint {str(folder)!r} is {problem}")
    return torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
