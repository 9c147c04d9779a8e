"""The logger sink ``jsonl``: every metrics row as one JSON object per line of
``RUN_DIR/metrics.jsonl``."""

from __future__ import annotations

import json

from seedbed.loggers import RunInfo
from seedbed.loggers.base import Row

FILE = "metrics.jsonl"


class JsonLinesSink:
    """Made once per run from its ``RunInfo``; ``write`` takes each row, ``close`` ends."""

    def __init__(self, run: RunInfo) -> None:
        path = run.run_dir / FILE
        kept = []
        if run.resume_frames is not None and path.is_file():  # rows after the checkpoint come again
            rows = [json.loads(line) for line in path.read_text().splitlines() if line]
            kept = [row for row in rows if row["frames"] <= run.resume_frames]
        self._file = path.open("w")
        for row in kept:
            self._file.write(json.dumps(row) + "\n")

    def write(self, row: Row) -> None:
        self._file.write(json.dumps(dict(row)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
