"""The run directory, checked before anything starts: one line saying what is wrong with it."""

from __future__ import annotations

from pathlib import Path

from seedbed.errors import SeedbedError

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
