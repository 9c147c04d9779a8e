"""The run directory: checked before anything starts (``check_run_dir``), then written as the run
goes (``RunFiles``); a problem with it is one line saying what is wrong and what to do."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from seedbed.config import RunConfig, TrainConfig
from seedbed.errors import SeedbedError
from seedbed.loggers import DEFAULT_LOGGERS, RunLogger
from seedbed.runtime.checkpoint import latest_checkpoint, load_latest, save_checkpoint
from seedbed.runtime.progress import check_settings
from seedbed.telemetry import replace_atomically, write_json_atomic

_PROBE = ".seedbed-write-probe"


def check_run_dir(run_dir: Path) -> None:
    """Make ``run_dir`` and its ``checkpoints`` folder and check that files can be written there.

    Raises:
        SeedbedError: One line naming the problem (not a directory, no permission, a full
            disk, ...) and what to do, before any process has started.
    """
    try:
        folder = run_dir / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        for where in (run_dir, folder):
            (where / _PROBE).write_bytes(b"seedbed")
            (where / _PROBE).unlink()
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        raise SeedbedError(
            f"--run-dir {run_dir} cannot be used ({e.strerror or e}{where}); choose another "
            "--run-dir, or make that one a writable directory"
        ) from None


def sinks(cfg: TrainConfig) -> tuple[str, ...]:
    """The metric sinks a run feeds: the defaults, W&B with ``--wandb``, then ``--loggers``
    (each once, in that order)."""
    wandb = ("wandb",) if cfg.wandb else ()
    return tuple(dict.fromkeys((*DEFAULT_LOGGERS, *wandb, *cfg.loggers)))


class RunFiles:
    """What a run writes into its directory as it runs: ``config.yaml``, the metric rows (through
    a ``RunLogger``: metrics.csv, TensorBoard, the console), checkpoints and ``summary.json``.

    The first write that fails mid-run (an unwritable or full disk) becomes one line naming the
    newest complete checkpoint (``unwritable``), and after it nothing more is written.
    """

    def __init__(self, run_dir: Path, frames: Callable[[], int]) -> None:
        self.run_dir = run_dir
        self.checkpoints = run_dir / "checkpoints"
        self.failed = False  # a write failed: nothing more is written
        self.logger: RunLogger | None = None  # replica 0's, while running
        self._frames = frames  # the run's frame count, for the failed write's line

    def prepare(self, config: RunConfig) -> tuple[Path, dict[str, Any]] | None:
        """Check the run directory and save the config (replica 0's job: the other replicas
        get what it found over the process group); with --resume, the checkpoint to resume from
        (the newest that loads) and its contents, once its settings are found to be
        ``config``'s (``--resume-mismatch accept``: or not)."""
        cfg = config.train
        found = load_latest(self.run_dir) if cfg.resume else None
        if cfg.resume and found is None:
            raise SeedbedError(f"--resume: {self.run_dir} has no checkpoint to resume from")
        if found is not None and cfg.resume_mismatch != "accept":  # before config.yaml changes
            check_settings(found[0], found[1].get("config"), config)
        if not cfg.resume and latest_checkpoint(self.run_dir) is not None:
            raise SeedbedError(
                f"{self.run_dir} already holds a run; pass --resume to continue it or choose "
                "another --run-dir"
            )
        check_run_dir(self.run_dir)
        saved = dict(
            config.to_dict(), run_dir=str(self.run_dir), resume=False, resume_mismatch="refuse"
        )
        text = yaml.safe_dump(saved, sort_keys=False)
        try:  # atomically: a crash mid-write must not leave a resume half its settings
            replace_atomically(self.run_dir / "config.yaml", lambda tmp: tmp.write_text(text))
        except OSError as e:
            raise SeedbedError(f"--run-dir {self.run_dir}: cannot save config.yaml ({e})") from None
        return found

    def open_logger(self, config: RunConfig, console: Console) -> None:
        """Open the metric sinks (replica 0's); a resumed run's go on after its checkpoint."""
        cfg = config.train
        with self.writing():
            self.logger = RunLogger(
                self.run_dir,
                total_frames=cfg.total_frames,
                resume_frames=self._frames() if cfg.resume else None,
                progress=cfg.progress,
                console=console,
                loggers=sinks(cfg),
                config=config,
            )

    def log(self, row: dict[str, Any]) -> None:
        """Write one metrics row, where this replica has the logger."""
        if self.logger is not None:
            with self.writing():
                self.logger.log(row)

    def close_logger(self) -> None:
        """Close the metric files; a failure to is the run directory's, said in one line."""
        if self.logger is None:
            return
        logger, self.logger = self.logger, None
        try:
            logger.close()
        except OSError as e:
            if not self.failed:
                raise self.unwritable(e) from None

    def save_checkpoint(self, frames: int, payload: dict[str, Any], keep: int) -> Path:
        """Write a checkpoint atomically, keeping the newest ``keep``; returns its path."""
        with self.writing():
            return save_checkpoint(self.checkpoints, frames, payload, keep)

    def write_summary(self, summary: dict[str, Any]) -> None:
        with self.writing():
            write_json_atomic(self.run_dir / "summary.json", summary)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write to the run directory: its OSError becomes ``unwritable``'s line."""
        try:
            yield
        except OSError as e:
            raise self.unwritable(e) from None

    def unwritable(self, e: OSError) -> SeedbedError:
        """The one-line error for a run directory that failed mid-run (unwritable, full)."""
        self.failed = True
        where = f": {e.filename}" if e.filename else ""
        newest = latest_checkpoint(self.run_dir)
        kept = f"its newest complete checkpoint, {newest}, is kept" if newest else "it has none"
        return SeedbedError(
            f"cannot write to the run directory {self.run_dir} ({e.strerror or e}{where}); "
            f"the run stopped at {self._frames():,} frames and {kept}; summary.json was not "
            "written: free space or make the directory writable, then --resume"
        )
