"""Where a run's metrics rows go: sinks by name, and the ``RunLogger`` that feeds them.

The training runtime makes one ``RunLogger`` per run and hands it a row per reporting interval;
it checks each row and passes it to every sink it was given, by name from ``LOGGERS``::

    with RunLogger(run_dir, total_frames=cfg.total_frames, resume_frames=ckpt_frames,
                   loggers=(*DEFAULT_LOGGERS, "wandb"), config=run_config) as log:
        while training:
            log.log({"frames": frames, "wall_s": wall_s, "mean_return": ..., ...})

A sink (``base.Sink``) is made from the run's ``RunInfo`` and has ``write(row)`` and
``close()``. A new one is a module here and a line in ``LOGGERS``; a user's is added with
``register`` by a plug-in module (see ``seedbed.plugins``) and named by the run setting
``loggers`` (``--loggers NAME,...``). Nothing here imports torch or wandb at import time: the
TensorBoard and W&B sinks import them when they are made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from seedbed.errors import ConfigError
from seedbed.loggers.base import Row, RunInfo, Sink, SinkFactory
from seedbed.loggers.console import ConsoleSink
from seedbed.loggers.csv import CsvSink
from seedbed.loggers.tensorboard import TensorBoardSink
from seedbed.loggers.wandb import WandbSink

if TYPE_CHECKING:
    from rich.console import Console

    from seedbed.config import RunConfig

__all__ = [
    "DEFAULT_LOGGERS",
    "LOGGERS",
    "RunInfo",
    "RunLogger",
    "Sink",
    "SinkFactory",
    "check_loggers",
    "register",
    "unregister",
]

LOGGERS: dict[str, SinkFactory] = {
    "csv": CsvSink,
    "tensorboard": TensorBoardSink,
    "console": ConsoleSink,
    "wandb": WandbSink,
}

#: What every run writes: metrics.csv, TensorBoard events and the console display.
DEFAULT_LOGGERS = ("csv", "tensorboard", "console")
_BUILTIN = tuple(LOGGERS)


def register(name: str, factory: SinkFactory) -> None:
    """Add sink ``name``: ``factory(run_info)`` opens one for a run (a class, usually).

    Registering the same factory under its name again does nothing.

    Raises:
        ConfigError: One line, when the name is taken or the factory cannot be called.
    """
    if LOGGERS.get(name) is factory:
        return
    if not name.isidentifier():
        raise ConfigError(f"logger name {name!r} must be a Python identifier (e.g. my_sink)")
    if name in LOGGERS:
        raise ConfigError(f"a logger named '{name}' is registered already")
    if not callable(factory):
        raise ConfigError(f"logger '{name}': {factory!r} is not a sink factory (a callable)")
    LOGGERS[name] = factory


def unregister(name: str) -> None:
    """Remove the sink ``name`` that ``register`` added (tests add some and clean up)."""
    if name in _BUILTIN:
        raise ConfigError(f"logger '{name}' is one of seedbed's own; it cannot be unregistered")
    LOGGERS.pop(name, None)


def check_loggers(names: Sequence[str]) -> None:
    """A one-line ConfigError naming the first of ``names`` not in ``LOGGERS``."""
    unknown = [name for name in names if name not in LOGGERS]
    if unknown:
        raise ConfigError(f"unknown logger {unknown[0]!r}; choose from {', '.join(LOGGERS)}")


class RunLogger:
    """Feeds a run's metrics rows to its sinks: by default metrics.csv and TensorBoard events in
    run_dir and the console progress display.

    Call ``log`` with one row per reporting interval, then ``close`` (or use it as a context
    manager). Every row must hold ``frames`` (env frames so far) and ``wall_s`` (seconds since the
    run started); any other key is an optional metric whose value may be None.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        total_frames: int | None,
        resume_frames: int | None = None,
        progress: bool = True,
        console: Console | None = None,
        loggers: Sequence[str] = DEFAULT_LOGGERS,
        config: RunConfig | None = None,
    ) -> None:
        """Opens the run's sinks, in the order of ``loggers``.

        Args:
            run_dir: Folder of the run; made if missing.
            total_frames: Frame budget, the progress total; None shows an open-ended bar.
            resume_frames: Frames of the checkpoint this run resumes from. metrics.csv rows after
                it are dropped, and TensorBoard events after it are purged, since the run will
                produce those steps again.
            progress: Whether to show progress on the console at all.
            console: Console to show progress on; a stderr console when None.
            loggers: Names in ``LOGGERS`` of the sinks to feed.
            config: The run's settings, for sinks that need them (wandb).

        Raises:
            ConfigError: A name not in ``LOGGERS``, or a sink's own (wandb not installed).
        """
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_frames = total_frames
        check_loggers(loggers)
        run = RunInfo(self.run_dir, total_frames, resume_frames, progress, console, config)
        #: The open sinks by name, in the order they receive each row.
        self.sinks: dict[str, Sink] = {}
        with contextlib.ExitStack() as opened:  # a sink that fails to open closes those before
            for name in loggers:
                sink = LOGGERS[name](run)
                opened.callback(sink.close)
                self.sinks[name] = sink
            # Closed last to first, each even when one before it fails.
            self._open = opened.pop_all()
        self._closed = False

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log(self, row: Row) -> None:
        """Passes one row of metrics to every sink.

        Args:
            row: Metrics by name; must hold ``frames`` and ``wall_s``. None values are written as
                empty CSV cells and skipped in TensorBoard and W&B.
        """
        if self._closed:
            raise RuntimeError("RunLogger.log called after close")
        for key in ("frames", "wall_s"):
            if row.get(key) is None:
                raise KeyError(f"metrics row needs {key!r}; got keys {sorted(row)}")
        for sink in self.sinks.values():
            sink.write(row)

    def close(self) -> None:
        """Closes every sink, last opened first, and raises the first failure after. Safe to
        call twice."""
        if self._closed:
            return
        self._closed = True
        self._open.close()
