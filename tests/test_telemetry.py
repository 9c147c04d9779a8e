"""Tests for seedbed.telemetry and the default sinks of seedbed.loggers.RunLogger: real files in
tmp_path, real TensorBoard and matplotlib."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from seedbed.loggers import RunLogger
from seedbed.telemetry import EpisodeWindow, plot_curve, read_metrics, write_json_atomic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _quiet(run_dir: Path, **kwargs) -> RunLogger:
    return RunLogger(
        run_dir, total_frames=kwargs.pop("total_frames", 1000), progress=False, **kwargs
    )


# EpisodeWindow


def test_window_empty_means_are_none():
    window = EpisodeWindow()
    assert window.mean_return() is None
    assert window.mean_length() is None
    assert window.count == 0
    assert not window.full()


def test_window_rolling_mean_matches_numpy_on_last_100():
    rng = np.random.default_rng(0)
    returns = rng.normal(50.0, 20.0, size=257)
    lengths = rng.integers(10, 500, size=257)
    window = EpisodeWindow(100)
    # Uneven batches, as episodes finish a few at a time across actors.
    for start, stop in [(0, 3), (3, 90), (90, 91), (91, 200), (200, 257)]:
        window.add(returns[start:stop], lengths[start:stop])
    assert window.count == 257
    assert window.full()
    assert window.mean_return() == pytest.approx(np.mean(returns[-100:]))
    assert window.mean_length() == pytest.approx(np.mean(lengths[-100:]))


def test_window_partial_and_mismatched_input():
    window = EpisodeWindow(4)
    window.add([1.0, 2.0], [10, 20])
    assert window.mean_return() == pytest.approx(1.5)
    assert not window.full()
    window.add([], [])
    assert window.count == 2
    with pytest.raises(ValueError):
        window.add([1.0], [1, 2])


def test_window_state_dict_round_trip():
    window = EpisodeWindow(5)
    window.add(np.arange(8, dtype=np.float32), np.arange(8) + 100)
    state = window.state_dict()
    # Plain Python values, so checkpoints need no numpy to read.
    assert json.loads(json.dumps(state)) == state
    restored = EpisodeWindow(5)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.count == 8
    assert restored.mean_return() == window.mean_return() == pytest.approx(5.0)
    assert restored.mean_length() == pytest.approx(105.0)


# RunLogger: CSV and TensorBoard


def test_run_logger_writes_csv_and_tensorboard(tmp_path):
    with _quiet(tmp_path) as log:
        log.log({"frames": 100, "wall_s": 1.0, "mean_return": None, "loss": 0.5})
        log.log({"frames": 200, "wall_s": 2.0, "mean_return": 12.5, "loss": None, "extra": 7})
        log.log({"frames": 300, "wall_s": 3.0})
    rows = _rows(tmp_path / "metrics.csv")
    assert rows[0] == ["frames", "wall_s", "mean_return", "loss"]
    assert rows[1] == ["100", "1.0", "", "0.5"]
    # A key not in the header is ignored; missing keys are empty cells.
    assert rows[2] == ["200", "2.0", "12.5", ""]
    assert rows[3] == ["300", "3.0", "", ""]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))

    metrics = read_metrics(tmp_path)
    np.testing.assert_array_equal(metrics["frames"], [100, 200, 300])
    assert math.isnan(metrics["mean_return"][0]) and metrics["mean_return"][1] == 12.5


def test_run_logger_rows_survive_without_close(tmp_path):
    log = _quiet(tmp_path)
    log.log({"frames": 10, "wall_s": 0.1, "loss": 1.0})
    # Flushed per row: another reader sees it before the logger closes.
    assert _rows(tmp_path / "metrics.csv")[1] == ["10", "0.1", "1.0"]
    log.close()
    log.close()


def test_run_logger_requires_frames_and_wall(tmp_path):
    with _quiet(tmp_path) as log, pytest.raises(KeyError):
        log.log({"wall_s": 1.0})


def test_resume_truncates_later_rows_and_appends(tmp_path):
    with _quiet(tmp_path) as log:
        for i in range(1, 6):
            log.log({"frames": i * 100, "wall_s": float(i), "mean_return": float(i)})
    # The run died after 500 frames; its last checkpoint was at 300.
    with _quiet(tmp_path, resume_frames=300) as log:
        assert [r[0] for r in _rows(tmp_path / "metrics.csv")] == ["frames", "100", "200", "300"]
        log.log({"frames": 400, "wall_s": 4.5, "mean_return": 40.0, "new_key": 1.0})
    rows = _rows(tmp_path / "metrics.csv")
    assert rows[0] == ["frames", "wall_s", "mean_return"]
    assert [r[0] for r in rows[1:]] == ["100", "200", "300", "400"]
    assert rows[-1] == ["400", "4.5", "40.0"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_resume_drops_half_written_row(tmp_path):
    (tmp_path / "metrics.csv").write_text("frames,wall_s,loss\n100,1.0,0.5\n200,2.0\n")
    with _quiet(tmp_path, resume_frames=1000) as log:
        log.log({"frames": 300, "wall_s": 3.0, "loss": 0.25})
    assert _rows(tmp_path / "metrics.csv")[1:] == [["100", "1.0", "0.5"], ["300", "3.0", "0.25"]]


def test_resume_without_existing_file_starts_fresh(tmp_path):
    with _quiet(tmp_path, resume_frames=500) as log:
        log.log({"frames": 600, "wall_s": 1.0})
    assert _rows(tmp_path / "metrics.csv") == [["frames", "wall_s"], ["600", "1.0"]]


# Console progress


def test_plain_progress_lines_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    log = RunLogger(tmp_path, total_frames=100_000, console=console)
    row = {
        "frames": 12_345,
        "wall_s": 1.0,
        "fps": 20_511.4,
        "mean_return": 87.31,
        "loss": 0.4123,
        "inference_batch": 64,
    }
    log.log(row)
    # Within the interval: throttled, but the latest state is printed on close.
    log.log({"frames": 20_000, "wall_s": 1.5, "mean_return": None})
    log.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "frames 12,345/100,000  fps 20,511  return 87.3  loss 0.412  inf-batch 64"
    assert lines[1] == "frames 20,000/100,000  fps 15,310"
    assert len(lines) == 2
    assert "\x1b" not in out.getvalue()


def test_plain_progress_interval(tmp_path):
    out = io.StringIO()
    log = RunLogger(tmp_path, total_frames=None, console=Console(file=out, force_terminal=False))
    log.sinks["console"].plain_interval_s = 0.0
    for i in range(3):
        log.log({"frames": i, "wall_s": float(i)})
    log.close()
    assert out.getvalue().splitlines()[0] == "frames 0"
    assert len(out.getvalue().splitlines()) == 3


def test_progress_false_prints_nothing(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with RunLogger(tmp_path, total_frames=10, progress=False, console=console) as log:
        log.log({"frames": 5, "wall_s": 1.0, "mean_return": 1.0})
    assert out.getvalue() == ""


def test_terminal_progress_bar_renders(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    with RunLogger(tmp_path, total_frames=1000, resume_frames=None, console=console) as log:
        log.log({"frames": 500, "wall_s": 1.0, "fps": 500.0, "mean_return": 3.0})
    assert "frames 500/1,000" in out.getvalue()


# Files


def test_write_json_atomic(tmp_path):
    data = {"lr": 3e-4, "steps": np.int64(7), "obs": np.arange(3), "dir": tmp_path}
    path = write_json_atomic(tmp_path / "config.json", data)
    assert path == tmp_path / "config.json"
    assert json.loads(path.read_text()) == {
        "lr": 3e-4,
        "steps": 7,
        "obs": [0, 1, 2],
        "dir": str(tmp_path),
    }
    write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_write_json_atomic_failure_keeps_old_file(tmp_path):
    path = write_json_atomic(tmp_path / "state.json", {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000


def test_plot_curve(tmp_path):
    with _quiet(tmp_path) as log:
        for i in range(50):
            ret = None if i < 5 else float(i)
            log.log({"frames": i * 1000, "wall_s": i * 0.5, "mean_return": ret})
    path = plot_curve(tmp_path, target_return=40.0)
    assert path == tmp_path / "curve.png"
    _assert_png(path)
    assert not list(tmp_path.glob(".*.tmp"))


def test_plot_curve_all_nan_returns(tmp_path):
    with _quiet(tmp_path) as log:
        for i in range(3):
            log.log({"frames": i, "wall_s": float(i), "mean_return": None})
    _assert_png(plot_curve(tmp_path, target_return=10.0))


def test_plot_curve_without_metrics(tmp_path):
    _assert_png(plot_curve(tmp_path))


def test_module_import_is_light():
    # Loaded from its file, so the check is of this module and not of the package __init__.
    spec = importlib.util.find_spec("seedbed.telemetry")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('telemetry', {spec.origin!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "heavy = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_resume_drops_rows_with_nul_bytes_or_broken_utf8(tmp_path):
    """A crash or a disk may leave NUL bytes or invalid UTF-8 in metrics.csv: the resume keeps
    the rows that parse instead of failing with a traceback."""
    (tmp_path / "metrics.csv").write_bytes(
        b"frames,wall_s,loss\n100,1.0,0.5\n\x00\x00\x00\x00\n2\xff0,2.0,0.4\n300,3.0,0.3\n"
    )
    with _quiet(tmp_path, resume_frames=1000) as log:
        log.log({"frames": 400, "wall_s": 4.0, "loss": 0.25})
    assert [r[0] for r in _rows(tmp_path / "metrics.csv")] == ["frames", "100", "300", "400"]
