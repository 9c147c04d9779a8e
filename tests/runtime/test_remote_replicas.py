"""A replicated learner with remote actors, as users run it: ``seedbed train --learner-replicas 2
--listen`` and ``seedbed actor`` processes that all dial the front door over 127.0.0.1, real
gRPC and a real torch.distributed group."""

from __future__ import annotations

import json
import signal

import pytest

from tests.conftest import finish, wait_for_frames
from tests.runtime.test_remote_training import actor, learner

# Two replicas and four actors are six busy processes: on their own xdist worker's turn.
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.xdist_group("replicas")]


@pytest.mark.parametrize("gateways", [1, 2], ids=["in-process", "2-gateway-processes"])
def test_two_replicas_share_remote_actors_and_train_cartpole(tmp_path, no_leaks, gateways):
    run = tmp_path / "run"
    flags = ("--learner-replicas", "2", "--remote-actors", "4", "--envs-per-actor", "16")
    flags += ("--gateways", str(gateways))
    target = ("--target-return", "195", "--total-frames", "2000000")
    lr, address = learner(run, *flags, *target)
    actors = [actor(run, address) for _ in range(4)]
    wait_for_frames(run, 20_000, lr)
    actors[0].send_signal(signal.SIGKILL)  # its replica is left with one actor
    actors[0].wait()
    actors.append(actor(run, address))  # placed on that replica, the one with fewer
    code, _, err = finish(lr, 420)
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return", summary
    assert summary["target_reached_mean_return"] >= 195
    assert summary["learner_replicas"] == 2 and summary["replicas_in_sync"] is True
    remote = summary["remote_actors"]
    assert remote["address"] == address  # the front door: what listen_address says
    served = [r["connections"] for r in remote["replicas"]]
    assert sorted(served) == [2, 3] and remote["connections"] == 5, remote
    assert remote["redirects"] >= 2 and remote["replicas"][1]["address"] != address
    for one in actors[1:]:  # told that training is over, by whichever replica served them
        code, out, _ = finish(one, 30)
        assert code == 0 and "training is over" in out, out[-2000:]
