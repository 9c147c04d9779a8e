"""The sink interface: one destination of a run's metrics rows, and what it is told of the run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console

    from seedbed.config import RunConfig

#: One metrics row: ``frames`` and ``wall_s`` always, other metrics by name, None where missing.
Row = Mapping[str, float | int | None]


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a sink is told about the run whose rows it receives.

    Attributes:
        run_dir: Folder of the run; it exists when a sink is made.
        total_frames: Frame budget; None for an open-ended run.
        resume_frames: Frames of the checkpoint a resumed run continues from; None for a fresh
            run. Rows a sink kept from after it will be produced again.
        progress: Whether the user wants progress on the console.
        console: The console to show it on; None: a stderr console.
        config: The run's resolved settings, for sinks that have some or record them; None
            when a ``RunLogger`` is used outside a training run.
    """

    run_dir: Path
    total_frames: int | None
    resume_frames: int | None = None
    progress: bool = True
    console: Console | None = None
    config: RunConfig | None = None


class Sink(Protocol):
    """One destination of metrics rows (a file, a display, a service).

    A ``RunLogger`` makes each sink from the run's ``RunInfo`` and then calls::

        sink = factory(run_info)  # opens files, connects; a resumed run drops later rows
        sink.write(row)           # once per reporting interval, frames increasing
        ...
        sink.close()              # once, also after a failed write; flushes and releases

    A sink flushes on its own schedule; ``write`` raises OSError when its files fail.
    """

    def write(self, row: Row) -> None:
        """Takes one metrics row; the caller has checked it holds ``frames`` and ``wall_s``."""
        ...

    def close(self) -> None:
        """Flushes what the sink holds and releases its files, threads and processes."""
        ...


#: How the registry makes a sink: a sink class, or any callable taking the run's info.
SinkFactory = Callable[[RunInfo], Sink]


def as_float(value: object) -> float | None:
    """A metric value as a float, or None for a missing or non-numeric one."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
