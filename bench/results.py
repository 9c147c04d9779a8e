"""Where a benchmark's JSON goes: always to stdout, and to a file when ``--out`` names one.

A table in docs/benchmarks.md names the file under docs/results/ that holds its figures, so it
can be regenerated from the JSON rather than copied from a terminal.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_out(parser: argparse.ArgumentParser, flag: str = "--out") -> None:
    """Adds the option that names the file the JSON is also written to."""
    parser.add_argument(
        flag,
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the JSON here (docs/results/NAME.json for a docs table)",
    )


def emit(report: dict | str, out: Path | None) -> None:
    """Prints the report as JSON (or the text given) and, given a path, writes the same there."""
    text = report if isinstance(report, str) else json.dumps(report, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
