"""Metric sinks write the same numbers everywhere and lose nothing already logged."""

import io
import json

import pytest
import torch

from grpo.run.metrics import JsonlLogger, MultiLogger, NullLogger, ProgressLogger, scalar_metrics
from grpo.run.plots import TIME_KEYS, phase_series, plot_run, read_metrics


def test_scalar_metrics_keeps_numbers_only():
    """0-dim tensors become floats; strings and vectors are dropped."""
    out = scalar_metrics({"a": torch.tensor(2.5), "b": 3, "c": "x", "d": torch.ones(2), "e": True})
    assert out == {"a": 2.5, "b": 3.0, "e": 1.0}


def test_jsonl_rows_are_flushed_and_nonfinite_is_null(tmp_path):
    """Each step is readable from disk before close; NaN is written as null."""
    logger = JsonlLogger(tmp_path / "m.jsonl")
    logger.log({"reward/mean": 0.5, "kl/mean": float("nan")}, step=1)
    rows = read_metrics(tmp_path / "m.jsonl")
    assert rows == [{"step": 1, "reward/mean": 0.5, "kl/mean": None}]
    logger.close()


def test_read_metrics_skips_half_written_line(tmp_path):
    """A crash mid-write leaves a partial last line, which is skipped, not fatal."""
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "x": 1.0}) + "\n" + '{"step": 2, "x"')
    assert read_metrics(path) == [{"step": 1, "x": 1.0}]


def test_progress_plain_lines_when_not_a_terminal():
    """Off a terminal the progress sink writes one plain line per `every` steps and at the end."""
    stream = io.StringIO()
    progress = ProgressLogger(total_steps=4, every=2, stream=stream)
    for step in range(1, 5):
        progress.log({"reward/mean": step / 10}, step)
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"]
    assert "reward=0.4" in lines[-1]


def test_progress_line_shows_seconds_per_step_and_tokens_per_second_after_the_header():
    """The header comes first; a step's line ends with s/step and tokens/s; a checkpoint's
    time record adds no line."""
    stream = io.StringIO()
    progress = ProgressLogger(total_steps=2, stream=stream, header="run directory runs/x")
    progress.log({"reward/mean": 0.5, "time/step": 0.125, "throughput/tokens_per_s": 1234.4}, 1)
    progress.log({"time/checkpoint": 3.0}, 1)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "run directory runs/x"
    assert lines[1].startswith("step 1/2 reward=0.5 0.125 s/step 1234 tokens/s elapsed ")
    assert len(lines) == 2


def test_multi_logger_fans_out(tmp_path):
    """MultiLogger writes the same row to every sink."""
    a, b = JsonlLogger(tmp_path / "a.jsonl"), JsonlLogger(tmp_path / "b.jsonl")
    multi = MultiLogger([a, b, NullLogger()])
    multi.log({"x": 1.0}, step=3)
    multi.close()
    assert (
        read_metrics(tmp_path / "a.jsonl")
        == read_metrics(tmp_path / "b.jsonl")
        == [{"step": 3, "x": 1.0}]
    )


def test_plot_run_writes_png(tmp_path):
    """The end-of-run plot is a real PNG file."""
    pytest.importorskip("matplotlib")
    logger = JsonlLogger(tmp_path / "m.jsonl")
    for step in range(1, 4):
        logger.log({"reward/mean": step * 0.1, "kl/mean": 0.01 * step}, step)
    logger.close()
    out = plot_run(tmp_path / "m.jsonl", tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_panel_stacks_the_phases_of_the_steps_that_logged_them(tmp_path):
    """The time panel's layers are the phases and time/other, from step rows only (not the
    evaluation or checkpoint rows of the same step), and their sum is time/step."""
    pytest.importorskip("matplotlib")
    logger = JsonlLogger(tmp_path / "m.jsonl")
    for step in (1, 2):
        phases = {key: 0.5 * step for key in TIME_KEYS}
        logger.log({"reward/mean": 0.1, **phases, "time/step": 0.5 * step * len(TIME_KEYS)}, step)
        logger.log({"eval/greedy/accuracy": 0.5, "time/eval": 9.0}, step)
        logger.log({"time/checkpoint": 7.0}, step)
    logger.close()
    rows = read_metrics(tmp_path / "m.jsonl")
    steps, series = phase_series(rows, TIME_KEYS)
    assert steps == [1, 2] and list(series) == list(TIME_KEYS)
    step_times = [r["time/step"] for r in rows if "time/step" in r]
    assert [sum(values) for values in zip(*series.values(), strict=True)] == step_times
    out = plot_run(tmp_path / "m.jsonl", tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_scalars_read_back(tmp_path):
    """TensorBoard events hold exactly the logged scalar values."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from grpo.run.metrics import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path / "tb")
    logger.log({"reward/mean": 0.25}, step=1)
    logger.log({"reward/mean": 0.75}, step=2)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.75)]
