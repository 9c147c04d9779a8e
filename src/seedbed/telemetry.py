"""What a run shows its user: console progress, metrics.csv, TensorBoard, JSON records, plots.

The training runtime drives one ``RunLogger`` per run and keeps an ``EpisodeWindow`` of finished
episodes::

    window = EpisodeWindow(100)
    with RunLogger(run_dir, total_frames=cfg.total_frames, resume_frames=ckpt_frames) as log:
        while training:
            window.add(finished_returns, finished_lengths)
            log.log({"frames": frames, "wall_s": wall_s, "mean_return": window.mean_return(), ...})
    plot_curve(run_dir, target_return=cfg.target_return)

Nothing here imports torch at module import time: the TensorBoard writer (which pulls torch in) and
matplotlib are imported only when a ``RunLogger`` or a plot is made, so tools that only read a
run's files stay light.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.csv"
CURVE_FILE = "curve.png"
_NOTE_STYLE = {"ha": "center", "va": "center", "color": "gray", "backgroundcolor": "white"}


class Stopwatch:
    """Where one thread's time goes: ``lap(name)`` books the time since the previous lap.

    One clock read per lap, so it stays on in every run; another thread may read ``seconds``.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def shares(self) -> dict[str, float]:
        """Each activity's fraction of the time booked so far."""
        seconds = dict(self.seconds)  # one atomic copy: the owning thread keeps lapping
        total = sum(seconds.values())
        return {k: round(v / total, 3) for k, v in seconds.items()} if total else {}


class EpisodeWindow:
    """Returns and lengths of the most recent ``size`` finished episodes (default 100)."""

    def __init__(self, size: int = 100) -> None:
        """Makes an empty window.

        Args:
            size: How many of the latest episodes the means are taken over.
        """
        if size < 1:
            raise ValueError(f"EpisodeWindow size must be >= 1, got {size}")
        self.size = size
        self._returns: deque[float] = deque(maxlen=size)
        self._lengths: deque[int] = deque(maxlen=size)
        self._count = 0

    def add(
        self, returns: Sequence[float] | np.ndarray, lengths: Sequence[int] | np.ndarray
    ) -> None:
        """Records finished episodes, oldest first.

        Args:
            returns: Undiscounted return of each finished episode.
            lengths: Length in env steps of each, in the same order.
        """
        returns = np.asarray(returns, dtype=np.float64).reshape(-1)
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if returns.shape != lengths.shape:
            raise ValueError(f"{returns.size} returns but {lengths.size} lengths")
        self._returns.extend(returns.tolist())
        self._lengths.extend(lengths.tolist())
        self._count += returns.size

    @property
    def count(self) -> int:
        """Episodes ever added, including those that have left the window."""
        return self._count

    def mean_return(self) -> float | None:
        """Mean return over the window, or None when no episode has finished yet."""
        return float(np.mean(self._returns)) if self._returns else None

    def mean_length(self) -> float | None:
        """Mean episode length over the window, or None when no episode has finished yet."""
        return float(np.mean(self._lengths)) if self._lengths else None

    def full(self) -> bool:
        """Whether the window holds ``size`` episodes, so its mean is over a full window."""
        return len(self._returns) == self.size

    def state_dict(self) -> dict:
        """The window as plain Python lists and ints, for checkpoints."""
        return {
            "size": self.size,
            "count": self._count,
            "returns": list(self._returns),
            "lengths": list(self._lengths),
        }

    def load_state_dict(self, d: dict) -> None:
        """Restores a window saved by ``state_dict``.

        This window keeps its own ``size``; a saved window of another size contributes its latest
        episodes, as many as fit.
        """
        self._returns = deque((float(r) for r in d["returns"]), maxlen=self.size)
        self._lengths = deque((int(n) for n in d["lengths"]), maxlen=self.size)
        self._count = int(d["count"])


_excepthook = threading.excepthook  # the one _quiet_writer_thread hands other errors to


def _quiet_writer_thread(args: threading.ExceptHookArgs) -> None:
    """Leave out the traceback of TensorBoard's writer thread when a write fails (a full disk):
    it keeps the error for the next write from the run's thread, where it becomes the run's
    one-line message; its own traceback would only bury that line."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _excepthook(args)


class RunLogger:
    """Writes metrics.csv and TensorBoard events in run_dir and drives the console progress display.

    Call ``log`` with one row per reporting interval, then ``close`` (or use it as a context
    manager). Every row must hold ``frames`` (env frames so far) and ``wall_s`` (seconds since the
    run started); any other key is an optional metric whose value may be None.
    """

    #: Seconds between plain progress lines when the console is not a terminal.
    plain_interval_s: float = 5.0
    #: Seconds between TensorBoard flushes; flushing every row would cost a syscall per row.
    tb_flush_interval_s: float = 10.0

    def __init__(
        self,
        run_dir: str | Path,
        *,
        total_frames: int | None,
        resume_frames: int | None = None,
        progress: bool = True,
        console: Console | None = None,
    ) -> None:
        """Opens the run's metric sinks.

        Args:
            run_dir: Folder of the run; made if missing.
            total_frames: Frame budget, the progress total; None shows an open-ended bar.
            resume_frames: Frames of the checkpoint this run resumes from. metrics.csv rows after
                it are dropped, and TensorBoard events after it are purged, since the run will
                produce those steps again.
            progress: Whether to show progress on the console at all.
            console: Console to show progress on; a stderr console when None.
        """
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_frames = total_frames
        self.console = console if console is not None else Console(stderr=True)
        self._csv_path = self.run_dir / METRICS_FILE
        self._csv_file: Any = None
        self._csv_writer: csv.DictWriter | None = None
        self._closed = False
        if resume_frames is not None:
            header = _truncate_metrics(self._csv_path, resume_frames)
            if header:
                self._open_csv(header, mode="a")

        # Imported here so that importing this module never pulls torch in.
        from torch.utils.tensorboard import SummaryWriter

        # Events from step purge_step on are dropped: keep the checkpoint's own row.
        purge = None if resume_frames is None else resume_frames + 1
        self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge)
        self._last_tb_flush = time.monotonic()
        if threading.excepthook is not _quiet_writer_thread:
            global _excepthook
            _excepthook, threading.excepthook = threading.excepthook, _quiet_writer_thread

        self._last_frames: int | None = None
        self._last_wall: float | None = None
        self._last_line: str | None = None
        self._last_line_printed = True
        self._last_print: float | None = None
        self._plain = progress and not self.console.is_terminal
        self._bar = _make_bar(self.console, total_frames) if progress and not self._plain else None
        if self._bar is not None:
            start = resume_frames or 0
            self._task = self._bar.add_task(
                "train", total=total_frames, completed=start,
                frames=_frames_text(start, total_frames), stats="",
            )  # fmt: skip
            self._bar.start()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log(self, row: Mapping[str, float | int | None]) -> None:
        """Writes one row of metrics to metrics.csv and TensorBoard and updates the progress.

        Args:
            row: Metrics by name; must hold ``frames`` and ``wall_s``. None values are written as
                empty CSV cells and skipped in TensorBoard.
        """
        if self._closed:
            raise RuntimeError("RunLogger.log called after close")
        for key in ("frames", "wall_s"):
            if row.get(key) is None:
                raise KeyError(f"metrics row needs {key!r}; got keys {sorted(row)}")
        frames, wall_s = int(row["frames"]), float(row["wall_s"])

        if self._csv_writer is None:
            self._open_csv(list(row), mode="w")
        self._csv_writer.writerow({k: "" if v is None else v for k, v in row.items()})
        # Flushed per row so that a crash loses at most the row being written.
        self._csv_file.flush()

        for key, value in row.items():
            scalar = _as_float(value)
            if key != "frames" and scalar is not None:
                self._tb.add_scalar(key, scalar, global_step=frames)
        now = time.monotonic()
        if now - self._last_tb_flush >= self.tb_flush_interval_s:
            self._tb.flush()
            self._last_tb_flush = now

        self._show(row, frames, wall_s, now)

    def close(self) -> None:
        """Stops the progress display and flushes and closes the files. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.stop()
        if self._plain and self._last_line is not None and not self._last_line_printed:
            # The final state is the line users look for at the end of a CI log.
            self._print_line(self._last_line)
        if self._csv_file is not None:
            self._csv_file.close()
        self._tb.close()

    def _open_csv(self, header: list[str], mode: str) -> None:
        self._csv_file = open(self._csv_path, mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._csv_writer = csv.DictWriter(
            self._csv_file, fieldnames=header, restval="", extrasaction="ignore"
        )
        if mode == "w":
            self._csv_writer.writeheader()

    def _show(self, row: Mapping[str, Any], frames: int, wall_s: float, now: float) -> None:
        fps = _as_float(row.get("fps"))
        if fps is None and self._last_frames is not None and wall_s > self._last_wall:
            fps = (frames - self._last_frames) / (wall_s - self._last_wall)
        self._last_frames, self._last_wall = frames, wall_s
        stats = _stats_text(
            fps,
            _as_float(row.get("mean_return")),
            _as_float(row.get("loss")),
            _as_float(row.get("inference_batch")),
        )
        frames_text = _frames_text(frames, self.total_frames)
        if self._bar is not None:
            self._bar.update(self._task, completed=frames, frames=frames_text, stats=stats)
        elif self._plain:
            self._last_line = f"{frames_text}  {stats}".rstrip()
            self._last_line_printed = False
            if self._last_print is None or now - self._last_print >= self.plain_interval_s:
                self._print_line(self._last_line)
                self._last_print = now

    def _print_line(self, line: str) -> None:
        # No markup or highlighting: plain lines must read the same in a CI log as in a pipe.
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self._last_line_printed = True


def write_json_atomic(path: str | Path, data: Mapping) -> Path:
    """Writes ``data`` as JSON so that readers see the old file or the new one, never half of one.

    Numpy scalars and arrays and paths are converted to plain JSON values.

    Args:
        path: Where the JSON goes; its folder must exist.
        data: What to write.

    Returns:
        ``path`` as a Path.
    """
    path = Path(path)
    text = json.dumps(data, indent=2, default=_json_default) + "\n"
    _replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """Reads a run's metrics.csv.

    Args:
        run_dir: Folder of the run.

    Returns:
        Each column by name as a float64 array; empty or unreadable cells are nan.

    Raises:
        FileNotFoundError: The run has no metrics.csv.
    """
    with open(Path(run_dir) / METRICS_FILE, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        columns: list[list[float]] = [[] for _ in header]
        for cells in reader:
            for i, column in enumerate(columns):
                column.append(_parse_float(cells[i]) if i < len(cells) else math.nan)
    return {
        name: np.asarray(col, dtype=np.float64) for name, col in zip(header, columns, strict=True)
    }


def plot_curve(run_dir: str | Path, target_return: float | None = None) -> Path:
    """Plots mean return against env frames and against wall-clock seconds to run_dir/curve.png.

    A run with no metrics or no finished episode gets empty axes with a note rather than an
    error, so that plotting never fails the end of a run.

    Args:
        run_dir: Folder of the run, holding metrics.csv.
        target_return: Return the run aims for, drawn as a dashed line; None draws none.

    Returns:
        Path of the PNG.
    """
    # A bare Figure renders through Agg without pyplot: no display needed, and unlike
    # matplotlib.use("Agg") it leaves the backend of a notebook or GUI session alone.
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    try:
        metrics = read_metrics(run_dir)
    except FileNotFoundError:
        metrics = {}
    empty = np.zeros(0)
    returns = metrics.get("mean_return", empty)
    try:  # the run's unit of frames (emulator frames on Atari), once summary.json exists
        unit = json.loads((run_dir / "summary.json").read_text())["frames_counted_as"]
    except (OSError, ValueError, KeyError):
        unit = "env frames"

    fig = Figure(figsize=(11, 4), layout="constrained")
    panels = fig.subplots(1, 2, sharey=True)
    for ax, xkey, xlabel, title in (
        (panels[0], "frames", unit, "Return vs frames"),
        (panels[1], "wall_s", "wall-clock seconds", "Return vs wall-clock time"),
    ):
        x = metrics.get(xkey, np.full(returns.shape, np.nan))
        keep = np.isfinite(x) & np.isfinite(returns)
        if keep.any():
            # Early rows have no finished episode yet; dropping them keeps the line unbroken.
            ax.plot(x[keep], returns[keep], color="tab:blue", label="mean return")
        else:
            ax.text(0.5, 0.6, "no finished episodes yet", transform=ax.transAxes, **_NOTE_STYLE)
        if target_return is not None:
            ax.axhline(
                target_return, color="tab:red", linestyle="--", label=f"target {target_return:g}"
            )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    panels[0].set_ylabel("mean return (last 100 episodes)")
    fig.suptitle(run_dir.resolve().name)

    out = run_dir / CURVE_FILE
    _replace_atomically(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return out


def _truncate_metrics(path: Path, resume_frames: int) -> list[str]:
    """Drops metrics.csv rows after ``resume_frames``; returns the header ([] if no file)."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if "frames" not in header:
            logger.warning("%s has no frames column; starting it afresh", path)
            return []
        at = header.index("frames")
        rows = list(reader)
    # A short row is the one being written when a run died; it is dropped with the later ones.
    kept = [r for r in rows if len(r) == len(header) and _parse_float(r[at]) <= resume_frames]

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(header)
            writer.writerows(kept)

    _replace_atomically(path, write)
    logger.info("resuming at %d frames: kept %d rows of %s", resume_frames, len(kept), path)
    return header


def _replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Has ``write`` fill a temp file beside ``path``, syncs it, then renames it over ``path``."""
    # Same folder, so os.replace is a rename within one file system and therefore atomic.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # Makes the rename itself durable; not every platform lets a folder be opened or synced.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _make_bar(console: Console, total_frames: int | None) -> Progress:
    # An open-ended run has no time remaining to show, only a pulsing bar.
    eta = [TextColumn("eta"), TimeRemainingColumn()] if total_frames is not None else []
    return Progress(
        TextColumn("{task.fields[frames]}"), BarColumn(), TimeElapsedColumn(), *eta,
        TextColumn("{task.fields[stats]}"), console=console, refresh_per_second=4,
    )  # fmt: skip


def _frames_text(frames: int, total: int | None) -> str:
    return f"frames {frames:,}" + (f"/{total:,}" if total is not None else "")


def _stats_text(
    fps: float | None, mean_return: float | None, loss: float | None, inf_batch: float | None
) -> str:
    parts = []
    if fps is not None:
        parts.append(f"fps {fps:,.0f}")
    if mean_return is not None:
        parts.append(f"return {mean_return:.1f}")
    if loss is not None:
        parts.append(f"loss {loss:.3g}")
    if inf_batch is not None:
        parts.append(f"inf-batch {round(inf_batch, 1):g}")
    return "  ".join(parts)


def _as_float(value: object) -> float | None:
    """A metric value as a float, or None for a missing or non-numeric one."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _parse_float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
