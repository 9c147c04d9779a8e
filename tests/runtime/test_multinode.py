"""A replicated learner across machines: two torchrun "nodes" on this machine form one run.

Each node is its own ``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d`` process, as
on two machines; they meet at a c10d rendezvous on 127.0.0.1. c10d numbers the nodes itself
(``--node-rank`` is for the static backend): by address, then by the agent's pid, so on one
machine the node started first is replica 0. The nodes run in folders of their own with a
relative ``--run-dir``, so a file a replica other than 0 wrote would show.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from seedbed.runtime.checkpoint import list_checkpoints, load_checkpoint
from tests.conftest import finish, wait_for_frames
from tests.runtime.test_faults import assert_one_line_error

# One worker for these: four training processes at once are all the two cores can carry.
pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("multinode")]

TINY = ["--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "4", "--unroll", "8"]
TINY += ["--batch", "8", "--target-return", "none", "--no-progress", "--no-energy"]
TINY += ["--log-every-s", "0.2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(node: Path, port: int, *flags: str) -> subprocess.Popen:
    """One node: torchrun and the replica it starts, in the folder ``node``."""
    node.mkdir(exist_ok=True)
    log = node / f"torchrun-{time.monotonic_ns()}.log"
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
        + [*rdzv, "-m", "seedbed", "train", *flags],
        cwd=node,
        stdout=open(log, "w"),  # noqa: SIM115 (the child holds it)
        stderr=subprocess.STDOUT,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},  # gloo on loopback, as in a test
    )
    proc.log = str(log)
    return proc


def two_nodes(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    port = free_port()
    first = torchrun(tmp_path / "node0", port, *flags)
    time.sleep(0.5)  # a lower pid: replica 0
    return first, torchrun(tmp_path / "node1", port, *flags)


def test_two_torchrun_nodes_train_cartpole_as_one_run(tmp_path, no_leaks):
    flags = ["--run-dir", "run", "--target-return", "195", "--total-frames", "1500000"]
    flags += ["--no-progress", "--no-energy"]
    nodes = two_nodes(tmp_path, *flags)
    (code0, out0, _), (code1, out1, _) = (finish(p, timeout=280) for p in nodes)
    assert code0 == 0 and code1 == 0, out0[-3000:] + out1[-3000:]
    run = tmp_path / "node0" / "run"
    assert not (tmp_path / "node1" / "run").exists()  # replica 1 wrote nothing
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", summary
    assert summary["target_reached_mean_return"] >= 195.0
    assert summary["learner_replicas"] == 2 and summary["replicas_in_sync"] is True
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()
    assert "target return 195 reached" in out0
    assert "this replica is done; replica 0 wrote the run's files" in out1


def worker(agent: subprocess.Popen) -> psutil.Process:
    """The replica process a torchrun agent started."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(agent.pid).children():
            if "seedbed" in " ".join(child.cmdline()):
                return child
        time.sleep(0.2)
    raise AssertionError("torchrun started no replica")


def test_a_replica_killed_mid_run_stops_the_run_in_one_line_and_resume_finishes(tmp_path, no_leaks):
    flags = [*TINY, "--run-dir", "run", "--total-frames", "8000", "--checkpoint-every-s", "0.5"]
    first, second = two_nodes(tmp_path, *flags)
    run = tmp_path / "node0" / "run"
    deadline = time.monotonic() + 120
    while not list_checkpoints(run / "checkpoints"):
        assert first.poll() is None and second.poll() is None, Path(first.log).read_text()
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
    survivor = worker(first)
    worker(second).send_signal(signal.SIGKILL)  # replica 1
    # torchrun's agent SIGTERMs the survivor when the other node fails, at a moment of its
    # own; within a second it is in the lost-replica roll call: the line must still come.
    time.sleep(1.0)
    survivor.send_signal(signal.SIGTERM)
    code, out, _ = finish(first, timeout=120)
    finish(second, timeout=60)
    assert code != 0
    # torchrun's own report follows the replica's line, so look at the replica's part.
    line = assert_one_line_error(out.split("Traceback")[0], "replica 1 of 2 was lost", "--resume")
    newest = list_checkpoints(run / "checkpoints")[-1]
    assert str(newest) in line or newest.name in line, line
    frames = load_checkpoint(newest)["frames"]
    assert 0 < frames < 8000
    assert not (run / "summary.json").exists()
    # Both nodes again, with the same flags and --resume: the run goes on to its end.
    resumed = two_nodes(tmp_path, *flags, "--resume")
    (code0, out0, _), (code1, out1, _) = (finish(p, timeout=180) for p in resumed)
    assert code0 == 0 and code1 == 0, out0[-3000:] + out1[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames" and summary["frames"] >= 8000
    assert summary["replicas_in_sync"] is True and summary["learner_replicas"] == 2
    assert not (tmp_path / "node1" / "run").exists()


def test_a_conflicting_learner_replicas_is_refused_in_one_line(tmp_path, no_leaks):
    nodes = two_nodes(tmp_path, *TINY, "--run-dir", "run", "--learner-replicas", "4")
    for proc in nodes:
        code, out, _ = finish(proc, timeout=120)
        assert code != 0
        assert_one_line_error(
            out.split("Traceback")[0], "--learner-replicas 4 (flag) does not match the 2"
        )


def test_replica_0s_refusal_of_its_run_directory_is_every_replicas_line(tmp_path, no_leaks):
    """Replica 1 has no run directory at all; replica 0's holds a run already. Both stop with
    replica 0's line, which reached replica 1 over the process group."""
    held = tmp_path / "node0" / "run" / "checkpoints"
    held.mkdir(parents=True)
    (held / "ckpt-000000001000.pt").write_bytes(b"")
    nodes = two_nodes(tmp_path, *TINY, "--run-dir", "run", "--total-frames", "3000")
    for proc in nodes:
        code, out, _ = finish(proc, timeout=120)
        assert code != 0
        assert_one_line_error(out.split("Traceback")[0], "run already holds a run", "--resume")
    assert not (tmp_path / "node1" / "run").exists()


def test_a_stop_signal_on_one_node_stops_every_replica_in_order(tmp_path, no_leaks):
    """SIGTERM to replica 1's torchrun alone (a scheduler stopping one machine): torchrun
    passes it to its replica, whose stop request stops all of them at the same learner step;
    replica 0 writes the final checkpoint and summary."""
    flags = [*TINY, "--run-dir", "run", "--total-frames", "100000000"]
    first, second = two_nodes(tmp_path, *flags)
    run = tmp_path / "node0" / "run"
    wait_for_frames(run, 2000, first)
    second.send_signal(signal.SIGTERM)
    (_, out0, _), (_, out1, _) = finish(first, timeout=120), finish(second, timeout=120)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted", out0[-3000:]
    assert summary["replicas_in_sync"] is True
    assert list_checkpoints(run / "checkpoints")[-1].name == f"ckpt-{summary['frames']:012d}.pt"
    assert "this replica is done" in out1, out1[-3000:]
