"""Checkpoints: written atomically, the newest kept, read back safely.

A checkpoint is one ``torch.save`` file holding plain data and tensors only, so it loads with
``weights_only=True`` (no arbitrary code runs from a checkpoint file; torch 2.6 or later, where
that holds). It is written to a temporary file in the same folder, flushed to disk, then renamed
over its final name, and the folder is synced: a crash leaves either the old set of checkpoints
or the new one, never a half-written file. One whose tensors hold a NaN or an infinity is never
written, so rotation never drops the last finite checkpoint for it.
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


class NonFiniteState(SeedbedError):
    """A checkpoint refused: a tensor in it holds a NaN or an infinity."""


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


def nonfinite_entry(value: Any, where: str = "") -> str | None:
    """The key path of the first floating tensor in ``value`` (nested dicts, lists and tuples)
    holding a NaN or an infinity, e.g. ``agent.network.value.weight``; None if there is none."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            return None if bool(torch.isfinite(value).all()) else where or "the tensor"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = nonfinite_entry(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def save_checkpoint(folder: Path, frames: int, payload: dict[str, Any], keep: int) -> Path:
    """Write ``payload`` as the checkpoint at ``frames`` and drop all but the newest ``keep``.

    Raises:
        NonFiniteState: One line, when a tensor of ``payload`` holds a NaN or an infinity:
            nothing is written and no checkpoint is dropped.
    """
    bad = nonfinite_entry(payload)
    if bad is not None:
        newest = list_checkpoints(folder)
        kept = f"the newest finite one, {newest[-1]}, is kept" if newest else "there is none yet"
        raise NonFiniteState(
            f"refused to write a checkpoint at {frames:,} frames: {bad} holds NaN or inf; "
            f"{kept}: lower --lr or set --max-grad-norm, then --resume"
        )
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
        sync_folder(folder)  # the rename itself, before any older checkpoint goes
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def sync_folder(folder: Path) -> None:
    """Make the renames and removals in ``folder`` durable (where a folder can be synced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not every platform opens folders
    try:
        os.fsync(fd)
    except OSError:
        pass  # nor syncs them
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint, or raise a one-line SeedbedError saying what is wrong with it.

    Raises:
        CorruptCheckpoint: The file was read but is no seedbed checkpoint: it does not parse,
            or holds another format.
        SeedbedError: The file could not be read (no such file, a folder, no permission, a
            disk error, out of memory): nothing says the checkpoint is bad.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            payload = torch.load(f, map_location="cpu", weights_only=True)
    except (OSError, MemoryError) as e:
        raise unreadable(path, e) from None
    except Exception as e:  # torch raises many types for a file that does not parse
        if isinstance(e.__context__, OSError | MemoryError):  # a read that failed under torch
            raise unreadable(path, e.__context__) from None
        reason = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(
            f"checkpoint {path} is corrupt ({reason}); delete it to resume from an older one",
            problem=reason,
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CorruptCheckpoint(
            f"checkpoint {path} is not a seedbed checkpoint of format {FORMAT}",
            problem=f"not a seedbed checkpoint of format {FORMAT}",
        )
    return payload


def unreadable(path: Path, error: BaseException) -> SeedbedError:
    """The one line for a checkpoint that could not be read at all."""
    if isinstance(error, FileNotFoundError):
        return SeedbedError(f"checkpoint {path} does not exist")
    if isinstance(error, MemoryError):
        why = "out of memory"
    else:
        why = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return SeedbedError(
        f"cannot read checkpoint {path} ({why}); it was left as it is: make it readable (its "
        "permissions, the disk), or move it away to resume from an older one"
    )


def load_latest(run_dir: str | Path, set_aside: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of a run that loads, and its payload; None if the run has none.

    A newer one that is corrupt (``CorruptCheckpoint``: a disk that failed under it, a copy cut
    short) is skipped with a warning and, with ``set_aside``, renamed to ``*.corrupt`` once an
    older one has loaded, so that it neither shadows the checkpoints written after the resume
    nor is taken for the newest again. One that cannot be read at all stops the search with its
    error: it may be whole. Partial writes left by a killed process are removed too. Raises
    the newest one's error if none loads, and then sets nothing aside.
    """
    folder = Path(run_dir) / "checkpoints"
    if set_aside and folder.is_dir():
        for partial in folder.glob(_PARTIAL):
            partial.unlink(missing_ok=True)
    found = list_checkpoints(folder)
    damaged: list[CorruptCheckpoint] = []
    for path in reversed(found):
        try:
            payload = load_checkpoint(path)
        except CorruptCheckpoint as e:
            damaged.append(e)
            continue
        for bad, e in zip(reversed(found[len(found) - len(damaged) :]), damaged, strict=True):
            log.warning(
                "the checkpoint %s is damaged (%s)%s; resuming from %s, an older one",
                bad,
                e.problem,
                f"; set aside as {bad.name}.corrupt" if set_aside else "",
                path.name,
            )
            if set_aside:
                bad.replace(bad.with_name(bad.name + ".corrupt"))
        if damaged and set_aside:
            sync_folder(folder)
        return path, payload
    if damaged:
        raise damaged[0]
    return None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of a run, or None."""
    found = list_checkpoints(Path(run_dir) / "checkpoints")
    return found[-1] if found else None
