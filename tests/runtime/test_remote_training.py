"""Training with remote actors as users run it: ``seedbed train --listen`` and ``seedbed actor``
processes talking gRPC, or the socket wire (``--wire socket``), over 127.0.0.1."""

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

from tests.conftest import finish, wait_for_frames

pytestmark = pytest.mark.slow


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "seedbed", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def learner(
    run_dir: Path, *flags: str, listen: str = "127.0.0.1:0"
) -> tuple[subprocess.Popen, str]:
    """A learner serving remote actors only; returns it and the address it listens on."""
    proc = start(
        *("train", "--listen", listen, "--actors", "0", "--remote-actors", "2"),
        *("--run-dir", str(run_dir), "--no-progress", "--log-every-s", "0.2", *flags),
    )
    proc.logs_dir = run_dir.parent  # where its actors' logs go (``actor``)
    address_file = run_dir / "listen_address"
    deadline = time.monotonic() + 60
    while not address_file.is_file():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the learner never started listening"
        time.sleep(0.1)
    return proc, address_file.read_text().strip()


def actor(run_dir: Path, address: str, *flags: str) -> subprocess.Popen:
    """A remote actor with the token the learner wrote into ``run_dir``.

    Its output goes to a file beside the run (``finish`` reads it back), not to a pipe: nobody
    reads an actor's pipes while the test waits on the learner, and an actor that filled one
    would block on its next log line and starve the learner.
    """
    token = str(run_dir / "actor-token")
    log = run_dir.parent / f"actor-{len(list(run_dir.parent.glob('actor-*.log')))}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seedbed", "actor", "--connect", address, "--token-file", token]
            + list(flags),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    proc.log, proc.logs_dir = log, run_dir.parent
    return proc


@pytest.mark.parametrize(
    "inference",
    [
        (),
        # The actors act themselves, in int8 (layers wide enough that int8 applies), and get
        # each policy over their stream.
        ("--inference", "local", "--actor-precision", "int8", "--hidden-sizes", "256,256"),
    ],
    ids=["central", "local-int8"],
)
def test_two_remote_actors_train_cartpole(tmp_path, no_leaks, inference):
    run = tmp_path / "run"
    flags = ("--target-return", "195", "--total-frames", "2000000", *inference)
    lr, address = learner(run, *flags)
    actors = [actor(run, address) for _ in range(2)]
    code, out, err = finish(lr)
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["stop_reason"] == "target_return" and summary["target_reached_mean_return"] >= 195
    )
    assert summary["remote_actors"]["connections"] == 2
    if inference:
        assert summary["inference"]["mode"] == "local"
        assert summary["inference"]["quantization_error_max"] > 0
    for one in actors:  # told that training is over: they leave by themselves, cleanly
        code, out, err = finish(one, 30)
        assert code == 0 and "training is over" in out, err[-2000:]


def test_a_remote_atari_actor_sends_single_frames_the_learner_stacks(tmp_path, no_leaks):
    run = tmp_path / "run"
    flags = ("--env", "atari:Pong", "--frame-stack-on", "learner", "--total-frames", "2000")
    small = ("--envs-per-actor", "2", "--batch", "2", "--minibatches", "2", "--threads", "1")
    lr, address = learner(run, *flags, *small, "--max-episode-frames", "400")
    actors = [actor(run, address) for _ in range(2)]
    code, out, err = finish(lr)
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frames"] >= 2000 and summary["learner_steps"] > 0
    for one in actors:
        assert finish(one, 30)[0] == 0


@pytest.mark.parametrize(
    ("gateways", "wire"),
    [("1", "grpc"), ("2", "grpc"), ("2", "socket")],
    ids=["in-process", "2-gateway-processes", "2-gateway-processes-socket-wire"],
)
def test_a_killed_actor_is_replaced_and_training_goes_on(tmp_path, no_leaks, gateways, wire):
    run = tmp_path / "run"
    flags = ("--gateways", gateways, "--target-return", "none", "--total-frames", "120000")
    lr, address = learner(run, *flags, "--wire", wire)
    first, second = (actor(run, address, "--wire", wire) for _ in range(2))
    wait_for_frames(run, 20_000, lr)
    first.send_signal(signal.SIGKILL)
    first.wait()
    replacement = actor(run, address, "--wire", wire)  # takes the freed slot
    code, _, err = finish(lr)
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames" and summary["frames"] >= 120_000
    assert summary["remote_actors"]["connections"] == 3
    for one in (second, replacement):
        assert finish(one, 30)[0] == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_actor_reconnects_when_it_loses_the_learner(tmp_path, no_leaks):
    listen = f"127.0.0.1:{free_port()}"
    token = ("--token-file", str(tmp_path / "token"))  # both learners': the actor's too
    (tmp_path / "token").write_text("shared\n")
    lost, address = learner(tmp_path / "a", *token, "--total-frames", "10000000", listen=listen)
    reconnecting = start("actor", "--connect", address, *token, "--reconnect-for", "60")
    wait_for_frames(tmp_path / "a", 5_000, lost)
    os.kill(lost.pid, signal.SIGKILL)  # the connection drops without a goodbye
    lost.communicate()
    time.sleep(1.0)
    again, _ = learner(tmp_path / "b", *token, "--total-frames", "20000", listen=listen)
    code, _, err = finish(again)
    assert code == 0, err[-2000:]
    code, out, err = finish(reconnecting, 30)
    assert code == 0 and "training is over" in out
    assert "reconnecting" in err or "retrying" in err


def test_an_actor_with_the_wrong_token_exits_with_one_line(tmp_path, no_leaks):
    (tmp_path / "token").write_text("right\n")
    (tmp_path / "wrong").write_text("wrong\n")
    run = tmp_path / "run"
    lr, address = learner(run, "--token-file", str(tmp_path / "token"), "--total-frames", "1e9")
    refused = start("actor", "--connect", address, "--token-file", str(tmp_path / "wrong"))
    code, _, err = finish(refused, 60)
    lr.send_signal(signal.SIGTERM)
    finish(lr)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("seedbed: error: the learner refused this actor")
    assert "token" in err.strip().splitlines()[-1]


def _probe_until_both_gateways_served(run_dir: Path, address: str, tries: int = 16) -> None:
    """Connect and leave ``tries`` times, each on a connection of its own, so that the kernel
    deals some to each of two gateway processes (all to one: one time in 2**15)."""
    from seedbed.transport.remote import GrpcActorClient

    token = (run_dir / "actor-token").read_bytes()
    for _ in range(tries):
        GrpcActorClient(address, token=token).close()


def test_a_remote_actor_trains_through_two_gateway_processes(tmp_path, no_leaks):
    run = tmp_path / "run"
    flags = ("--gateways", "2", "--target-return", "none", "--total-frames", "30000")
    lr, address = learner(run, *flags)
    _probe_until_both_gateways_served(run, address)
    one = actor(run, address)
    code, _, err = finish(lr)
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frames"] >= 30_000 and summary["learner_steps"] > 0
    remote = summary["remote_actors"]
    assert remote["gateway_processes"] == 2 and remote["connections"] == 17
    assert sum(remote["connections_by_gateway"]) == 17
    assert min(remote["connections_by_gateway"]) > 0, remote  # both processes served
    code, out, _ = finish(one, 30)
    assert code == 0 and "training is over" in out


def _gateway_processes(learner_pid: int) -> list[psutil.Process]:
    """The learner's gateway processes, by the name they give themselves, in index order."""
    from seedbed.transport.remote.gateway_process import PROCESS_NAME

    found = [p for p in psutil.Process(learner_pid).children() if p.name().startswith(PROCESS_NAME)]
    return sorted(found, key=lambda p: p.name())


def test_a_killed_gateway_process_stops_the_run_in_one_line(tmp_path, no_leaks):
    run = tmp_path / "run"
    lr, address = learner(
        run, "--gateways", "2", "--target-return", "none", "--total-frames", "1e9"
    )
    one = actor(run, address)
    wait_for_frames(run, 2_000, lr)
    gateways = _gateway_processes(lr.pid)
    assert len(gateways) == 2
    gateways[1].kill()
    code, out, err = finish(lr, 120)
    assert code != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("seedbed: error: gateway process") and "exited with code -9" in last
    assert f"pid {gateways[1].pid}" in last and "Traceback" not in err
    assert not [p.pid for p in gateways if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finish(one, 60)  # told that training is over, or it lost its stream: it leaves
