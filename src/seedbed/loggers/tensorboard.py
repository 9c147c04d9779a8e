"""The TensorBoard sink: event files under run_dir/tb, one scalar per metric, steps in frames."""

from __future__ import annotations

import threading
import time

from seedbed.loggers.base import Row, RunInfo, as_float

TB_DIR = "tb"

_excepthook = threading.excepthook  # the one _quiet_writer_thread hands other errors to


def _quiet_writer_thread(args: threading.ExceptHookArgs) -> None:
    """Leave out the traceback of TensorBoard's writer thread when a write fails (a full disk):
    it keeps the error for the next write from the run's thread, where it becomes the run's
    one-line message; its own traceback would only bury that line."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _excepthook(args)


class TensorBoardSink:
    """Adds each row's numeric metrics as scalars at step ``frames``; None values are skipped.

    A resumed run purges the events after its checkpoint, which it will produce again.
    """

    #: Seconds between flushes; flushing every row would cost a syscall per row.
    flush_interval_s: float = 10.0

    def __init__(self, run: RunInfo) -> None:
        # Imported here so that importing seedbed.loggers never pulls torch in.
        from torch.utils.tensorboard import SummaryWriter

        # Events from step purge_step on are dropped: keep the checkpoint's own row.
        purge = None if run.resume_frames is None else run.resume_frames + 1
        self._writer = SummaryWriter(str(run.run_dir / TB_DIR), purge_step=purge)
        self._last_flush = time.monotonic()
        if threading.excepthook is not _quiet_writer_thread:
            global _excepthook
            _excepthook, threading.excepthook = threading.excepthook, _quiet_writer_thread

    def write(self, row: Row) -> None:
        frames = int(row["frames"])
        for key, value in row.items():
            scalar = as_float(value)
            if key != "frames" and scalar is not None:
                self._writer.add_scalar(key, scalar, global_step=frames)
        now = time.monotonic()
        if now - self._last_flush >= self.flush_interval_s:
            self._writer.flush()
            self._last_flush = now

    def close(self) -> None:
        self._writer.close()
