"""Checkpoints: written atomically, the newest kept, read back safely.

A checkpoint is one ``torch.save`` file holding plain data and tensors only, so it loads with
``weights_only=True`` (no arbitrary code runs from a checkpoint file). It is written to a temporary
file in the same folder, flushed to disk, then renamed over its final name: a crash leaves either
the old set of checkpoints or the new one, never a half-written file.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from seedbed.errors import SeedbedError

log = logging.getLogger(__name__)

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")
_PARTIAL = ".ckpt-*.tmp"  # a write a SIGKILL cut short


class CorruptCheckpoint(SeedbedError):
    """A checkpoint file that cannot be read back as a seedbed checkpoint; ``problem`` says how."""

    def __init__(self, message: str, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


def checkpoint_path(folder: Path, frames: int) -> Path:
    return folder / f"ckpt-{frames:012d}.pt"


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in ``folder``, oldest first (by the frame count in their name)."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(folder: Path, frames: int, payload: dict[str, Any], keep: int) -> Path:
    """Write ``payload`` as the checkpoint at ``frames`` and drop all but the newest ``keep``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, frames)
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                torch.save({"format": FORMAT, **payload}, f)
            except RuntimeError as e:
                # A failed write (a full disk, a file-size limit) comes out of torch's zip
                # writer as a RuntimeError about positions; the OSError behind it says why.
                if isinstance(e.__context__, OSError):
                    raise e.__context__ from None
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint, or raise a one-line SeedbedError saying what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise SeedbedError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for damaged files
        reason = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(
            f"checkpoint {path} is corrupt or unreadable ({reason}); delete it to resume from "
            "an older one",
            problem=reason,
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CorruptCheckpoint(
            f"checkpoint {path} is not a seedbed checkpoint of format {FORMAT}",
            problem=f"not a seedbed checkpoint of format {FORMAT}",
        )
    return payload


def load_latest(run_dir: str | Path, set_aside: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of a run that loads, and its payload; None if the run has none.

    A newer one that is corrupt (a disk that failed under it, a copy cut short) is skipped with a
    warning and, with ``set_aside``, renamed to ``*.corrupt``, so that it neither shadows the
    checkpoints written after the resume nor is taken for the newest again. Partial writes left
    by a killed process are removed too. Raises the oldest one's error if none loads.
    """
    folder = Path(run_dir) / "checkpoints"
    if set_aside and folder.is_dir():
        for partial in folder.glob(_PARTIAL):
            partial.unlink(missing_ok=True)
    found = list_checkpoints(folder)
    for i, path in enumerate(reversed(found)):
        try:
            payload = load_checkpoint(path)
        except CorruptCheckpoint as e:
            if i == len(found) - 1:
                raise  # the oldest too: nothing to fall back on
            aside = path.with_name(path.name + ".corrupt")
            if set_aside:
                path.replace(aside)
            log.warning(
                "the newest checkpoint %s is damaged (%s)%s; resuming from the one before it",
                path,
                e.problem,
                f"; set aside as {aside.name}" if set_aside else "",
            )
            continue
        return path, payload
    return None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of a run, or None."""
    found = list_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None
