"""Metric sinks: one logger object writes a step's metrics wherever asked.

A training step returns a flat dict of floats under namespaced keys
(`reward/mean`, `loss/policy`, ...). The loop hands that dict to one
`MetricsLogger`; it never branches on where metrics go. Every sink writes the
same dict, so a JSONL line, a TensorBoard scalar and a W&B point always agree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "MetricsLogger",
    "NullLogger",
    "JsonlLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "ProgressLogger",
    "MultiLogger",
    "scalar_metrics",
]

log = logging.getLogger("grpo")


class MetricsLogger(Protocol):
    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Keep the entries that are real numbers (0-dim tensors included), as floats."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, int | float):
            out[key] = float(value)
    return out


class NullLogger:
    """Accepts everything, writes nothing: call sites never need an `if logger`."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger:
    """One JSON object per step, flushed at once so a crash loses no logged step."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        # NaN/inf are not JSON: write them as null rather than break the file.
        row = {k: (v if math.isfinite(v) else None) for k, v in scalar_metrics(metrics).items()}
        self._file.write(json.dumps({"step": step, **row}, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardLogger:
    """TensorBoard event files (needs the `tracking` extra: `pip install tensorboard`)."""

    def __init__(self, log_dir: str | os.PathLike[str], purge_step: int | None = None) -> None:
        """`purge_step`: a resumed run hides events logged at or after this step by the first try."""
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """Weights & Biases; `mode="offline"` writes locally and needs no account."""

    def __init__(
        self,
        project: str,
        run_dir: str | os.PathLike[str],
        mode: str = "offline",
        config: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        import wandb

        self._run = wandb.init(
            project=project,
            dir=str(run_dir),
            mode=mode,
            config=dict(config or {}),
            name=name,
            reinit=True,
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._run.log(scalar_metrics(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class ProgressLogger:
    """A tqdm bar on a terminal; plain log lines (one every `every` steps) otherwise.

    Step records show reward, KL, loss, seconds per step and tokens per second;
    evaluation records (keys "eval/...") get a line of their own; a checkpoint's
    time ("time/checkpoint") adds nothing to its step's line. `header`, when
    given, is written once before anything else (the run directory, say).
    """

    SHOWN = ("reward/mean", "kl/mean", "step_loss")
    RATES = (("time/step", "{:.3g} s/step"), ("throughput/tokens_per_s", "{:.0f} tokens/s"))

    def __init__(
        self,
        total_steps: int,
        every: int = 1,
        stream: Any = None,
        start_step: int = 0,
        header: str | None = None,
    ) -> None:
        self.total_steps = total_steps
        self.every = max(1, every)
        self.stream = stream if stream is not None else sys.stderr
        self.start_step = start_step  # a resumed run: time left counts from here
        self._start = time.monotonic()
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps, initial=start_step, file=self.stream, dynamic_ncols=True
            )
        if header is not None:
            self._write(header)

    def _summary(self, metrics: Mapping[str, float]) -> str:
        shown = [f"{k.split('/')[0]}={metrics[k]:.4g}" for k in self.SHOWN if k in metrics]
        shown += [form.format(metrics[k]) for k, form in self.RATES if k in metrics]
        return " ".join(shown)

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        scalars = scalar_metrics(metrics)
        evaluation = {k: v for k, v in scalars.items() if k.startswith("eval/")}
        if evaluation:
            shown = " ".join(f"{k[5:]}={v:.4g}" for k, v in evaluation.items())
            self._write(f"eval at step {step}: {shown}")
            return
        if "time/checkpoint" in scalars:  # after its step, whose line is written already
            return
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(self._summary(scalars))
            return
        if step % self.every and step != self.total_steps:
            return
        elapsed = time.monotonic() - self._start
        done = max(step - self.start_step, 1)
        left = elapsed / done * max(self.total_steps - step, 0)
        self._write(
            f"step {step}/{self.total_steps} {self._summary(scalars)} "
            f"elapsed {elapsed:.0f}s left {left:.0f}s"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class MultiLogger:
    """Fans one `log` call out to several sinks."""

    def __init__(self, sinks: Iterable[MetricsLogger]) -> None:
        self.sinks = list(sinks)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
