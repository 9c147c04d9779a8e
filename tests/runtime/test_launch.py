"""``seedbed launch --ray``: a learner and remote actors as Ray actors on a local 2-CPU Ray."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import finish, interruptible, wait_for_frames

pytest.importorskip("ray", reason="Ray is the 'ray' extra (in dev)")
pytestmark = pytest.mark.slow

RAY_PARTS = ("raylet", "gcs_server", "ray::", "default_worker", "dashboard", "log_monitor")


def ray_processes() -> set[int]:
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        with_args = " ".join(p.info["cmdline"] or ())
        if any(part in with_args for part in RAY_PARTS):
            found.add(p.info["pid"])
    return found


@pytest.fixture
def nothing_left_behind():
    """Fail if Ray's processes outlive the launch (they may take a few seconds to exit)."""
    before = ray_processes()
    yield
    deadline = time.monotonic() + 20
    while (left := ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [" ".join(psutil.Process(p).cmdline()) for p in left if psutil.pid_exists(p)]


def launch(run_dir, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "seedbed", "launch", "--ray", "--actors", "2"]
        + ["--actor-cpus", "0.5", "--run-dir", str(run_dir), "--log-every-s", "0.2", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,  # one test stops it with SIGINT
    )


def test_launch_trains_and_leaves_nothing_behind(tmp_path, nothing_left_behind):
    code, out, err = finish(launch(tmp_path / "run", "--target-return", "195"))
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return"
    assert summary["remote_actors"]["connections"] == 2
    assert "target return 195 reached" in out


def test_a_dead_actor_is_restarted_by_ray(tmp_path, nothing_left_behind):
    run = tmp_path / "run"
    proc = launch(run, "--target-return", "none", "--total-frames", "400000")
    wait_for_frames(run, 30_000, proc)
    victims = [p for p in psutil.process_iter(["cmdline"]) if "ActorHost" in " ".join(p.cmdline())]
    assert victims, "no actor process found"
    victims[0].kill()
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames"
    assert summary["remote_actors"]["connections"] >= 3  # the restarted actor came back


def test_ctrl_c_stops_everything_and_keeps_the_run(tmp_path, nothing_left_behind):
    run = tmp_path / "run"
    proc = launch(run, "--target-return", "none", "--total-frames", "100000000")
    wait_for_frames(run, 10_000, proc)
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["frames"] >= 10_000
