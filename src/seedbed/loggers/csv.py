"""The metrics.csv sink: one row per reporting interval, flushed as it is written."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import IO

from seedbed.loggers.base import Row, RunInfo
from seedbed.telemetry import METRICS_FILE, parse_float, replace_atomically

logger = logging.getLogger(__name__)


class CsvSink:
    """Writes rows to run_dir/metrics.csv; its columns are the first row's keys.

    A later row's keys outside them are left out, and its missing ones are empty cells, as are
    None values. A resumed run keeps the rows up to its checkpoint and appends to them.
    """

    def __init__(self, run: RunInfo) -> None:
        self.path = run.run_dir / METRICS_FILE
        self._file: IO[str] | None = None
        self._writer: csv.DictWriter | None = None
        if run.resume_frames is not None:
            header = _truncate_metrics(self.path, run.resume_frames)
            if header:
                self._open(header, mode="a")

    def write(self, row: Row) -> None:
        if self._writer is None:
            self._open(list(row), mode="w")
        self._writer.writerow({k: "" if v is None else v for k, v in row.items()})
        # Flushed per row so that a crash loses at most the row being written.
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def _open(self, header: list[str], mode: str) -> None:
        self._file = open(self.path, mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._writer = csv.DictWriter(
            self._file, fieldnames=header, restval="", extrasaction="ignore"
        )
        if mode == "w":
            self._writer.writeheader()


def _truncate_metrics(path: Path, resume_frames: int) -> list[str]:
    """Drops metrics.csv rows after ``resume_frames``, and rows that do not parse; returns the
    header ([] if no file)."""
    if not path.exists():
        return []
    # A disk or a crash may leave NUL bytes or broken UTF-8 behind: the rows they touch fail
    # to parse and go, rather than the resume.
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(line.replace("\0", "") for line in f)
        header = next(reader, [])
        if "frames" not in header:
            logger.warning("%s has no frames column; starting it afresh", path)
            return []
        at = header.index("frames")
        rows = list(reader)
    # A short row is the one being written when a run died; it is dropped with the later ones.
    kept = [r for r in rows if len(r) == len(header) and parse_float(r[at]) <= resume_frames]

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(header)
            writer.writerows(kept)

    replace_atomically(path, write)
    logger.info("resuming at %d frames: kept %d rows of %s", resume_frames, len(kept), path)
    return header
