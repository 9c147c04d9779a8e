"""What comes in from actors, as a whole run meets it: a user's env that gives NaN now and then,
one that gives nothing else, a hostile remote actor with the token (a real gRPC client on
127.0.0.1 against ``seedbed train --listen``), and a thousand idle HTTP/2 connections. Each
run keeps learning, or stops in one line; its checkpoints load and hold only finite values."""

from __future__ import annotations

import json
import math
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from seedbed.runtime.checkpoint import list_checkpoints, load_checkpoint
from seedbed.telemetry import read_metrics
from seedbed.transport.remote import GrpcActorClient, Refused
from tests.conftest import finish, wait_for_frames
from tests.runtime.test_remote_training import actor, learner, start

pytestmark = pytest.mark.slow

NAN_NOW_AND_THEN = "tests.runtime.nan_envs:NanCartPole-v0"
ALWAYS_NAN = "tests.runtime.nan_envs:AlwaysNan-v0"
QUICK = ("--no-progress", "--log-every-s", "0.5", "--checkpoint-every-s", "1")


def finite(value) -> bool:
    """Whether every float in a checkpoint's payload (tensors, numbers, containers) is finite."""
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(finite(v) for v in value)
    return True


def assert_checkpoints_load_and_are_finite(run: Path) -> None:
    paths = list_checkpoints(run / "checkpoints")
    assert paths, "no checkpoint was written"
    for path in paths:
        assert finite(load_checkpoint(path)), path


def test_a_users_env_that_gives_nan_now_and_then_still_trains(tmp_path, no_leaks):
    run = tmp_path / "run"
    flags = ("--env", NAN_NOW_AND_THEN, "--actors", "2", "--envs-per-actor", "4")
    budget = ("--total-frames", "40000", "--target-return", "none")
    code, _, err = finish(start("train", *flags, *budget, "--run-dir", str(run), *QUICK))
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    refused = summary["refused_from_actors"]
    # Each of the 8 envs gives a NaN every 300 of its ~5,000 steps.
    assert refused["steps"] >= 80 and set(refused["steps_by_actor"]) == {"0", "1"}
    assert summary["stop_reason"] == "total_frames" and summary["learner_steps"] > 0
    assert 25 < summary["mean_return_100"] < 501  # learning: a random policy scores about 22
    assert_checkpoints_load_and_are_finite(run)


def test_a_users_env_that_gives_only_nan_stops_the_run_in_one_line(tmp_path, no_leaks):
    run = tmp_path / "run"
    flags = ("--env", ALWAYS_NAN, "--actors", "1", "--max-actor-restarts", "1")
    code, _, err = finish(start("train", *flags, "--run-dir", str(run), *QUICK))
    assert code != 0
    named = [line for line in err.splitlines() if "fix the environment" in line]
    assert named and f"({ALWAYS_NAN}) gave a non-finite obs in 100 steps in a row" in named[0]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("seedbed: error: actor 0 died")


def hostile_acted(client: GrpcActorClient, **bad) -> dict[str, np.ndarray]:
    """What a local actor acted, all zeros but ``bad``: field -> (env row, value)."""
    job = client.assignment
    acted = {n: np.zeros((job.num_envs, *s), np.dtype(d)) for n, s, d in job.acted()}
    for name, (row, value) in bad.items():
        acted[name][row] = value
    return acted


def hostile_steps(client: GrpcActorClient) -> None:
    """Every kind of refused step, then absurd returns, with the learner's token."""
    e = client.assignment.num_envs
    obs, zeros = np.zeros((e, 4), np.float32), np.zeros(e, np.float32)
    no, yes = np.zeros(e, bool), np.ones(e, bool)

    def send(obs=obs, reward=zeros, done=no, **bad) -> None:
        client.call(obs, reward, done, no, hostile_acted(client, **bad))

    send(done=yes)
    send(reward=np.full(e, np.nan, np.float32))
    send(obs=np.full((e, 4), np.inf, np.float32))
    send(action=(0, 99))  # CartPole has actions 0 and 1
    send(action=(1, -3))
    send(logits=(2, np.nan))
    send(state0=(3, np.inf))
    send(reward=np.full(e, 3e38, np.float32), done=yes)  # a return of 3e38 in one step
    for _ in range(15):  # 1.5e30 over 15 steps, each of them finite
        send(reward=np.full(e, 1e29, np.float32))
    send(done=yes)


def test_a_hostile_remote_actor_with_the_token_harms_nothing(tmp_path, no_leaks):
    run = tmp_path / "run"
    flags = ("--inference", "local", "--actors", "1", "--envs-per-actor", "4", "--lstm")
    # A target no CartPole run reaches in these frames, but one 3e38 return in the window would.
    goal = ("--target-return", "400", "--target-episodes", "1", "--total-frames", "8000")
    lr, address = learner(run, *flags, *goal, *QUICK)
    token = (run / "actor-token").read_bytes()
    hostile = GrpcActorClient(address, token=token)
    hostile_steps(hostile)
    hostile.close()
    wrong_shape = GrpcActorClient(address, token=token)
    acted = hostile_acted(wrong_shape)
    acted["state0"] = np.zeros((4, 3, 3), np.float32)  # not the LSTM's shape
    with pytest.raises(Refused, match="bad step"):
        zeros = np.zeros(4, np.float32)
        wrong_shape.call(np.zeros((4, 4), np.float32), zeros, zeros > 0, zeros > 0, acted)
    wrong_shape.close()
    code, _, err = finish(lr)
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames" and summary["target_reached_frames"] is None
    refused = summary["refused_from_actors"]
    assert refused["steps_by_actor"].get("1", 0) >= 4 * 2 + 5  # slot 1: the remote one
    assert refused["episode_returns"] >= 4  # the 1.5e30 ones (the 3e38 step was refused)
    assert summary["remote_actors"]["refused"] >= 1  # the wrong-shaped step
    assert math.isfinite(summary["mean_return_100"]) and summary["mean_return_100"] < 501
    assert_checkpoints_load_and_are_finite(run)


def _descriptors(limit: int) -> None:
    """In the learner's child: the usual 1024 open files, soft and hard (no room to raise)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def test_a_thousand_idle_connections_leave_the_actor_served_and_checkpoints_written(
    tmp_path, no_leaks
):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "seedbed", "train", "--listen", "127.0.0.1:0", "--actors", "0"]
    cmd += ["--remote-actors", "1", "--total-frames", "1e9", "--run-dir", str(run), *QUICK]
    lr = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: _descriptors(1024),
    )
    deadline = time.monotonic() + 60
    while not (run / "listen_address").is_file():
        assert lr.poll() is None and time.monotonic() < deadline, lr.communicate()
        time.sleep(0.1)
    address = (run / "listen_address").read_text().strip()
    real = actor(run, address)
    wait_for_frames(run, 2_000, lr)
    before = set(list_checkpoints(run / "checkpoints"))
    frames_before = read_metrics(run)["frames"][-1]
    flood = subprocess.run(  # holds them 8 s, then lets go by itself
        [sys.executable, "-m", "tests.transport.idle_connections", address, "1000", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert flood.returncode == 0, flood.stderr[-2000:]
    held = json.loads(flood.stdout)
    assert held["connected"] >= 1000 - 50 and held["closed_by_server"] > 500  # past the cap
    during = set(list_checkpoints(run / "checkpoints")) - before
    served = read_metrics(run)["frames"][-1] - frames_before
    lr.send_signal(signal.SIGTERM)  # an orderly stop: final checkpoint and summary
    _, _, err = finish(lr)
    assert "Traceback" not in err and (run / "summary.json").is_file(), err[-2000:]
    assert during, "no checkpoint was written while the connections were held"
    assert served > 1_000, served  # the real actor went on all the while
    summary = json.loads((run / "summary.json").read_text())
    assert summary["remote_actors"]["connections"] == 1  # the real actor, never cut off
    assert_checkpoints_load_and_are_finite(run)
    assert finish(real, 30)[0] == 0
