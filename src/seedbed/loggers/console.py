"""The console sink: a rich progress bar on a terminal, a plain line now and then elsewhere."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from seedbed.loggers.base import Row, RunInfo, as_float


class ConsoleSink:
    """Shows frames, fps, return, loss and inference batch of the latest row.

    On a terminal, a live bar; otherwise (a CI log, a pipe) a plain line every
    ``plain_interval_s``, and the last row's line at close; nothing when ``progress`` is off.
    """

    #: Seconds between plain progress lines when the console is not a terminal.
    plain_interval_s: float = 5.0

    def __init__(self, run: RunInfo) -> None:
        self.console = run.console if run.console is not None else Console(stderr=True)
        self.total_frames = run.total_frames
        self._last_frames: int | None = None
        self._last_wall: float | None = None
        self._last_line: str | None = None
        self._last_line_printed = True
        self._last_print: float | None = None
        self._plain = run.progress and not self.console.is_terminal
        show_bar = run.progress and not self._plain
        self._bar = _make_bar(self.console, run.total_frames) if show_bar else None
        if self._bar is not None:
            start = run.resume_frames or 0
            self._task = self._bar.add_task(
                "train", total=run.total_frames, completed=start,
                frames=_frames_text(start, run.total_frames), stats="",
            )  # fmt: skip
            self._bar.start()

    def write(self, row: Row) -> None:
        frames, wall_s = int(row["frames"]), float(row["wall_s"])
        fps = as_float(row.get("fps"))
        if fps is None and self._last_frames is not None and wall_s > self._last_wall:
            fps = (frames - self._last_frames) / (wall_s - self._last_wall)
        self._last_frames, self._last_wall = frames, wall_s
        stats = _stats_text(
            fps,
            as_float(row.get("mean_return")),
            as_float(row.get("loss")),
            as_float(row.get("inference_batch")),
        )
        frames_text = _frames_text(frames, self.total_frames)
        if self._bar is not None:
            self._bar.update(self._task, completed=frames, frames=frames_text, stats=stats)
        elif self._plain:
            self._last_line = f"{frames_text}  {stats}".rstrip()
            self._last_line_printed = False
            now = time.monotonic()
            if self._last_print is None or now - self._last_print >= self.plain_interval_s:
                self._print_line(self._last_line)
                self._last_print = now

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self._plain and self._last_line is not None and not self._last_line_printed:
            # The final state is the line users look for at the end of a CI log.
            self._print_line(self._last_line)

    def _print_line(self, line: str) -> None:
        # No markup or highlighting: plain lines must read the same in a CI log as in a pipe.
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        self._last_line_printed = True


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
