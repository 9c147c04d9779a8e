"""Checkpoints (``seedbed.runtime.checkpoint``): never written with NaN, synced with their folder,
and read back so that only a file that does not parse counts as damaged."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from seedbed.errors import SeedbedError
from seedbed.runtime.checkpoint import (
    CorruptCheckpoint,
    NonFiniteState,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)


def payload(value: float) -> dict:
    return {
        "agent": {
            "network": {"w": torch.full((2,), value), "steps": torch.tensor(3)},
            "optimizer": {"state": {0: {"exp_avg": torch.zeros(2)}}},
        },
        "frames": 1,
    }


def test_a_checkpoint_holding_nan_or_inf_is_refused_and_the_finite_ones_are_kept(tmp_path):
    folder = tmp_path / "checkpoints"
    for frames in (100, 200):
        save_checkpoint(folder, frames, payload(1.0), keep=2)
    kept = list_checkpoints(folder)
    with pytest.raises(NonFiniteState) as refused:
        save_checkpoint(folder, 300, payload(float("nan")), keep=2)
    line = str(refused.value)
    assert "\n" not in line and "agent.network.w holds NaN or inf" in line
    assert str(kept[-1]) in line
    bad = payload(1.0)
    bad["agent"]["optimizer"]["state"][0]["exp_avg"][1] = float("inf")
    with pytest.raises(NonFiniteState, match=r"agent\.optimizer\.state\.0\.exp_avg"):
        save_checkpoint(folder, 400, bad, keep=1)
    assert list_checkpoints(folder) == kept  # rotation never ran for the refused ones
    assert sorted(p.name for p in folder.iterdir()) == [p.name for p in kept]
    for path in kept:
        assert load_checkpoint(path)["agent"]["network"]["w"].isfinite().all()


def test_a_checkpoint_syncs_its_folder_after_the_rename(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    save_checkpoint(tmp_path, 100, payload(1.0), keep=1)
    assert synced == [False, True]  # the file's data, then the folder that names it


def _corrupt(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK\x03\x04 not a whole zip")
    return path


def test_a_damaged_newest_checkpoint_is_set_aside_only_once_an_older_one_loads(tmp_path):
    folder = tmp_path / "checkpoints"
    _corrupt(checkpoint_path(folder, 100))
    _corrupt(checkpoint_path(folder, 200))
    with pytest.raises(CorruptCheckpoint, match="ckpt-000000000200"):
        load_latest(tmp_path)
    assert not list(folder.glob("*.corrupt"))  # nothing older loaded: nothing set aside
    save_checkpoint(folder, 50, payload(1.0), keep=10)
    path, state = load_latest(tmp_path)
    assert path == checkpoint_path(folder, 50) and state["frames"] == 1
    assert sorted(p.name for p in folder.glob("*.corrupt")) == [
        "ckpt-000000000100.pt.corrupt",
        "ckpt-000000000200.pt.corrupt",
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/mem")
def test_an_unreadable_newest_checkpoint_stops_the_resume_and_is_left_as_it_is(tmp_path):
    """A newest checkpoint that cannot be read (here a real EIO: reading /proc/self/mem at 0
    fails so, even for root, where chmod 000 would not) may be whole: the resume stops in one
    line naming the error rather than set it aside and go back to an older one."""
    folder = tmp_path / "checkpoints"
    save_checkpoint(folder, 100, payload(1.0), keep=10)
    newest = checkpoint_path(folder, 200)
    newest.symlink_to("/proc/self/mem")
    with pytest.raises(SeedbedError) as stopped:
        load_latest(tmp_path)
    assert not isinstance(stopped.value, CorruptCheckpoint)
    assert "cannot read checkpoint" in str(stopped.value) and "Input/output error" in str(
        stopped.value
    )
    assert newest.is_symlink() and not list(folder.glob("*.corrupt"))
    newest.unlink()
    newest.mkdir()  # a folder where the newest checkpoint should be: the same
    with pytest.raises(SeedbedError, match="cannot read checkpoint .*Is a directory"):
        load_latest(tmp_path)
    assert newest.is_dir() and not list(folder.glob("*.corrupt"))


def test_the_torch_seedbed_allows_loads_weights_only_without_running_code():
    """Before torch 2.6, ``torch.load(weights_only=True)`` could still run code from a crafted
    file (CVE-2025-32434): the oldest torch allowed, and the one pinned, are 2.6 or later."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    (torch_req,) = [r for r in project["dependencies"] if r.startswith("torch")]
    lowest = torch_req.split(">=")[1].split(",")[0]
    assert tuple(map(int, lowest.split(".")[:2])) >= (2, 6), torch_req
    pinned = (root / "constraints.txt").read_text().splitlines()
    (pin,) = [line.split("==")[1] for line in pinned if line.startswith("torch==")]
    assert tuple(map(int, pin.split(".")[:2])) >= (2, 6), pin
    assert tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])) >= (2, 6)
