"""Fault injection: signals at random moments, killed processes and failing run directories.

Each test starts a real ``seedbed train`` process, hurts it, and checks what is kept: complete,
loadable checkpoints, a summary whose numbers match the newest of them, metrics that never go
back, and no orphan processes or shared memory. Hostile gRPC clients are in
``tests/transport/test_grpc_faults.py``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from seedbed.runtime.checkpoint import list_checkpoints, load_checkpoint
from tests.conftest import (
    finish,
    interruptible,
    leaked_shm,
    shm_blocks,
    tiny_settings,
    wait_for_frames,
    workers,
)
from tests.test_cli import flags

pytestmark = pytest.mark.faults

FOREVER = 50_000_000  # frames: the run ends only by the fault


def start(run: Path, preexec=interruptible, env=None, **overrides) -> subprocess.Popen:
    """``seedbed train`` in a session of its own (so a test can signal its whole group)."""
    settings = tiny_settings(
        run, **{"total_frames": FOREVER, "checkpoint_every_s": 0.3, "energy": False, **overrides}
    )
    return subprocess.Popen(
        [sys.executable, "-m", "seedbed", "train", *flags(settings)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        start_new_session=True,
        env=env,
    )


def wait_for_checkpoints(run: Path, proc: subprocess.Popen, count: int = 2) -> list[int]:
    """Wait until the run has written ``count`` checkpoints; the pids of its process tree."""
    deadline = time.monotonic() + 120
    while len(list_checkpoints(run / "checkpoints")) < count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run wrote no checkpoints"
        time.sleep(0.05)
    return [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]


def rows(run: Path) -> list[dict[str, str]]:
    """metrics.csv's complete rows (a full disk may cut the last one short)."""
    with open(run / "metrics.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if None not in r.values()]


def assert_kept(run: Path, tree: list[int], shm_before: set[str]) -> dict | None:
    """What every fault must leave: complete checkpoints, consistent records, nothing behind.

    Returns the newest checkpoint's payload.
    """
    folder = run / "checkpoints"
    assert not list(folder.glob(".ckpt-*.tmp")), "a half-written checkpoint was left"
    payloads = [load_checkpoint(path) for path in list_checkpoints(folder)]
    assert payloads, "no complete checkpoint"
    newest = payloads[-1]
    logged = rows(run)
    frames = [int(r["frames"]) for r in logged]
    assert frames == sorted(set(frames)), "metrics rows repeat or go back"
    assert int(logged[-1]["frames"]) >= newest["frames"]
    if (run / "summary.json").exists():
        summary = json.loads((run / "summary.json").read_text())
        assert summary["checkpoint"] == str(list_checkpoints(folder)[-1])
        assert (summary["frames"], summary["learner_steps"]) == (
            newest["frames"],
            newest["learner_steps"],
        )
        # The final checkpoint follows the last row; with no frame after it, a few more
        # learner steps may have been taken.
        assert frames[-1] == newest["frames"]
        assert int(logged[-1]["learner_steps"]) <= newest["learner_steps"]
    assert_nothing_left(tree, shm_before)
    return newest


def assert_nothing_left(tree: list[int], shm_before: set[str], wait_s: float = 15.0) -> None:
    """No process of the run's tree alive and no shared memory of its left (actors and the
    resource tracker of a killed learner notice it gone within seconds)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in tree if psutil.pid_exists(p) and not _zombie(p)]
        leaked = leaked_shm(shm_before, settle_s=0)  # this loop waits
        if not (alive or leaked) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, f"orphan processes: {alive}"
    assert not leaked, f"leaked shared memory: {leaked}"


def _zombie(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True


@pytest.mark.parametrize(
    ("signals", "seed", "layout"),
    [
        (2, 0, {}),
        (2, 1, {}),
        (2, 2, {}),
        (3, 3, {}),
        (2, 4, {"learner_replicas": 2, "batch": 8}),
        (2, 5, {"learner_process": True}),
        (3, 6, {"learner_process": True}),
    ],
    ids=["2a", "2b", "2c", "3", "2-replicated", "2-learner-process", "3-learner-process"],
)
def test_repeated_stop_signals_never_lose_the_run(tmp_path, signals, seed, layout):
    """SIGTERM to the learner, then more to its whole group (as ``timeout`` sends them, or a
    user pressing Ctrl-C again), at random moments: checkpoints are written every 0.3 s, so
    some land while one is being written. Two signals keep the final checkpoint, summary and
    curve; a third stops at once and keeps the complete checkpoints written until then. With
    two learner replicas the launcher alone acts on them; an update process of its own
    (``--learner-process``) leaves them to the learner too."""
    rng = random.Random(seed)
    run, before = tmp_path / "r", shm_blocks()
    proc = start(run, **layout)
    tree = wait_for_checkpoints(run, proc)
    time.sleep(rng.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGTERM)
    for _ in range(signals - 1):
        time.sleep(rng.uniform(0.0, 0.15) if signals == 3 else rng.uniform(0.0, 0.6))
        with contextlib.suppress(ProcessLookupError):  # the stop may be over already
            os.killpg(proc.pid, signal.SIGTERM)
    code, out, err = finish(proc, timeout=60)
    assert "Traceback" not in err, err[-3000:]
    assert code == 130, err[-3000:]
    if signals < 3:
        assert (run / "summary.json").is_file() and (run / "curve.png").is_file(), err[-3000:]
        assert json.loads((run / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert_kept(run, tree, before)


def test_a_learner_killed_while_writing_a_checkpoint_resumes(tmp_path):
    """SIGKILL the learner the moment a checkpoint write is under way (a 1 MB net makes the
    write take a while): the complete checkpoints load, nothing is left running or mapped, and
    --resume continues from the newest complete one, clearing the partial write."""
    run, before = tmp_path / "r", shm_blocks()
    proc = start(run, hidden_sizes="256,256")
    tree = wait_for_checkpoints(run, proc)
    deadline = time.monotonic() + 30
    while not list((run / "checkpoints").glob(".ckpt-*.tmp")) and time.monotonic() < deadline:
        pass  # a busy wait: the write lasts milliseconds
    os.kill(proc.pid, signal.SIGKILL)
    finish(proc, timeout=30)
    assert not (run / "summary.json").exists()
    assert_nothing_left(tree, before)
    complete = [load_checkpoint(p)["frames"] for p in list_checkpoints(run / "checkpoints")]
    assert complete
    settings = tiny_settings(run, total_frames=max(complete) + 2000, resume=True, energy=False)
    settings["hidden_sizes"] = "256,256"
    result = subprocess.run(
        [sys.executable, "-m", "seedbed", "train", *flags(settings)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_kept(run, [], before)


def test_a_killed_update_process_ends_the_run_in_one_line(tmp_path):
    """SIGKILL the learner's update process (``--learner-process``): the run stops with one line
    that says how to go on, keeps its complete checkpoints and leaves nothing behind."""
    run, before = tmp_path / "r", shm_blocks()
    proc = start(run, learner_process=True)
    tree = wait_for_checkpoints(run, proc)
    spawned = [
        p
        for p in psutil.Process(proc.pid).children()
        if "spawn_main" in " ".join(p.cmdline())  # actors come from the fork server instead
    ]
    assert len(spawned) == 1, spawned
    spawned[0].kill()
    code, _, err = finish(proc, timeout=60)
    assert code == 2, err[-3000:]
    assert_one_line_error(err, "learner process ended unexpectedly", "--resume")
    assert not (run / "summary.json").exists()
    assert_kept(run, tree, before)


def test_actors_killed_mid_step_are_replaced(tmp_path):
    """SIGKILL actors at random moments, most of them waiting on a step in flight: each is
    restarted and counted, and the run ends as asked with consistent records."""
    rng = random.Random(7)
    run, before = tmp_path / "r", shm_blocks()
    # Three kills, each after both actors are up again, take about 12,000 frames of this layout.
    proc = start(run, total_frames=36_000, checkpoint_every_s=1000.0)
    wait_for_frames(run, 2000, proc)
    learner = psutil.Process(proc.pid)
    kills = 0
    while kills < 3:
        actors = workers(learner, recursive=True)  # forked from the learner's fork server
        if len(actors) == 2:  # both up: none is still being restarted
            rng.choice(actors).kill()
            kills += 1
        time.sleep(rng.uniform(0.3, 0.8))
    tree = [proc.pid, *(c.pid for c in learner.children(recursive=True))]
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames"
    assert summary["actor_restarts"] == kills
    assert_kept(run, tree, before)


def _immutable(path: Path, on: bool) -> bool:
    """``chattr -R +i``: a directory even root cannot write in; False where unsupported."""
    flag = "+i" if on else "-i"
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", "-R", flag, str(path)], capture_output=True)
    return done.returncode == 0


def assert_one_line_error(err: str, *words: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("seedbed: error:")]
    assert len(lines) == 1, err[-3000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def test_a_run_directory_made_unwritable_mid_run_stops_in_one_line(tmp_path):
    run, before = tmp_path / "r", shm_blocks()
    proc = start(run)
    tree = wait_for_checkpoints(run, proc)
    if not _immutable(run, True):
        proc.kill()
        finish(proc)
        pytest.skip("chattr +i is not available here (needs root and a file system with it)")
    try:
        code, _, err = finish(proc, timeout=60)
    finally:
        _immutable(run, False)
    assert code == 2, err[-3000:]
    line = assert_one_line_error(err, "cannot write to the run directory", "--resume")
    newest = list_checkpoints(run / "checkpoints")[-1]
    assert str(newest) in line
    assert not (run / "summary.json").exists()
    assert_kept(run, tree, before)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs, mounted for the test (root only)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_full_disk_stops_the_run_in_one_line(small_disk):
    run, before = small_disk / "r", shm_blocks()
    proc = start(run)
    tree = wait_for_checkpoints(run, proc)
    with open(small_disk / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:  # until the disk is full
            f.write(b"\0" * 65536)
            f.flush()
    code, _, err = finish(proc, timeout=60)
    assert code == 2, err[-3000:]
    assert_one_line_error(err, "cannot write to the run directory", "No space left on device")
    (small_disk / "filler").unlink()
    assert not (run / "summary.json").exists()
    assert_kept(run, tree, before)


def test_a_file_size_limit_stops_the_run_in_one_line(tmp_path):
    """Past RLIMIT_FSIZE a write fails with EFBIG (the run ignores SIGXFSZ, which would end it
    without a word): a 16 KiB limit is under any CartPole checkpoint, even one written before the
    first update (~48 KB; ~139 KB once Adam holds its moments)."""
    import resource

    def limited() -> None:
        interruptible()
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))

    run, before = tmp_path / "r", shm_blocks()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # no .pyc write may meet the limit
    proc = start(run, preexec=limited, env=env)
    code, _, err = finish(proc, timeout=120)
    assert code == 2, err[-3000:]
    line = assert_one_line_error(err, "cannot write to the run directory", "File too large")
    assert "it has none" in line
    assert not list((run / "checkpoints").iterdir())  # no partial write either
    assert_nothing_left([], before)


def _finite(payload: object) -> bool:
    """Whether every floating tensor in a checkpoint's payload is finite."""
    if isinstance(payload, torch.Tensor):
        return not payload.is_floating_point() or bool(payload.isfinite().all())
    if isinstance(payload, dict):
        return all(_finite(v) for v in payload.values())
    if isinstance(payload, list | tuple):
        return all(_finite(v) for v in payload)
    return True


def test_a_diverging_run_stops_in_one_line_and_keeps_finite_checkpoints(tmp_path):
    """A learning rate of 1e30 makes the weights huge in a step or two; every later loss is
    inf or NaN. Each such step is skipped and counted, and 20 updates in a row stop the run in
    one line; every checkpoint, the final one included, loads and holds only finite values."""
    run, before = tmp_path / "r", shm_blocks()
    proc = start(run, lr=1e30, checkpoint_every_s=0.2)
    code, _, err = finish(proc, timeout=120)
    assert code == 2, err[-3000:]
    assert_one_line_error(err, "not finite", "20 updates in a row", "--resume")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["skipped_steps"] >= 20
    assert int(rows(run)[-1]["skipped_steps"]) == summary["skipped_steps"]
    checkpoints = list_checkpoints(run / "checkpoints")
    assert checkpoints and summary["checkpoint"] == str(checkpoints[-1])
    assert all(_finite(load_checkpoint(path)) for path in checkpoints)
    assert_kept(run, [], before)


# A user's agent with a bug in acting: PPO, whose act raises once the run is under way.
_BOOM = {
    "__init__.py": "import seedbed.agents\n\nseedbed.agents.register('boom', 'boomplug')\n",
    "config.py": (
        "import dataclasses\n"
        "from seedbed.agents.ppo.config import ACTIONS, PPOConfig\n"
        "@dataclasses.dataclass\nclass BoomConfig(PPOConfig):\n    pass\n"
        "CONFIG_CLASS = BoomConfig\n"
    ),
    "learning.py": (
        "from seedbed.agents.ppo.learning import PPOAgent\n"
        "class BoomAgent(PPOAgent):\n"
        "    calls = 0\n"
        "    def act(self, net, step, state):\n"
        "        BoomAgent.calls += 1\n"
        "        if BoomAgent.calls > 200:\n"
        "            raise RuntimeError('boom while acting')\n"
        "        return super().act(net, step, state)\n"
        "AGENT_CLASS = BoomAgent\n"
    ),
}


def test_an_inference_thread_that_raises_stops_the_run_in_one_line(tmp_path):
    """The inference thread dies of a bug while acting: the run stops with one line naming
    it and a final checkpoint, rather than idle forever with no frames and no checkpoints."""
    package = tmp_path / "plugins" / "boomplug"
    package.mkdir(parents=True)
    for name, text in _BOOM.items():
        (package / name).write_text(text)
    path = os.pathsep.join([str(tmp_path / "plugins"), os.environ.get("PYTHONPATH", "")])
    run, before = tmp_path / "r", shm_blocks()
    env = {**os.environ, "PYTHONPATH": path}
    proc = start(run, env=env, plugins="boomplug", agent="boom", checkpoint_every_s=1000.0)
    code, _, err = finish(proc, timeout=120)
    assert code == 2, err[-3000:]
    assert_one_line_error(err, "the inference thread failed", "RuntimeError: boom while acting")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["frames"] > 0
    assert load_checkpoint(summary["checkpoint"])["frames"] == summary["frames"]
    assert_kept(run, [], before)


def test_a_stop_signal_to_the_whole_process_group_restarts_no_actor(tmp_path):
    """`timeout -s TERM` and a scheduler signal the whole process group: the fork server the
    actors came from ends with it, which must not read as dead actors to restart."""
    run, before = tmp_path / "r", shm_blocks()
    proc = start(run, checkpoint_every_s=1000.0)
    wait_for_frames(run, 1000, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    code, _, err = finish(proc, timeout=120)
    assert code == 130, err[-3000:]
    assert "died" not in err and "restarting" not in err, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["actor_restarts"] == 0
    assert_kept(run, [], before)
