"""What a run keeps of itself: episode returns, time shares, JSON records, metrics.csv, plots.

The training runtime keeps an ``EpisodeWindow`` of finished episodes and hands its rows to a
``seedbed.loggers.RunLogger`` (metrics.csv, TensorBoard, the console, W&B)::

    window = EpisodeWindow(100)
    with RunLogger(run_dir, total_frames=cfg.total_frames, resume_frames=ckpt_frames) as log:
        while training:
            window.add(finished_returns, finished_lengths)
            log.log({"frames": frames, "wall_s": wall_s, "mean_return": window.mean_return(), ...})
    plot_curve(run_dir, target_return=cfg.target_return)

Nothing here imports torch or matplotlib at module import time: matplotlib is imported only when
a plot is made, so tools that only read a run's files stay light.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

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
        return combined_shares([self])


def combined_shares(watches: list[Stopwatch]) -> dict[str, float]:
    """Each activity's fraction of the time booked so far by all of ``watches`` together
    (threads that do the same work, each with its own stopwatch)."""
    seconds: dict[str, float] = {}
    for watch in watches:
        for name, value in dict(watch.seconds).items():  # one atomic copy: its thread laps on
            seconds[name] = seconds.get(name, 0.0) + value
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
    replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
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
                column.append(parse_float(cells[i]) if i < len(cells) else math.nan)
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
    replace_atomically(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return out


def replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
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


def parse_float(cell: str) -> float:
    """A metrics.csv cell as a float; nan for an empty or unreadable one."""
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
