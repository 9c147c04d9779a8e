"""The learner's updates in a process of their own (``--learner-process``): the same updates as
in the loop's thread, bit for bit; failures of that process as one line; whole runs with it."""

from __future__ import annotations

import contextlib

import pytest
import torch

from seedbed.agents import make_agent
from seedbed.errors import ConfigError, SeedbedError
from seedbed.inference.publish import PolicyPublisher
from seedbed.inference.server import InferenceServer
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import load_checkpoint
from seedbed.runtime.lr_schedule import LearningRates
from seedbed.runtime.train import train
from seedbed.runtime.updates import InlineUpdates, LearnerProcess
from seedbed.telemetry import Stopwatch
from seedbed.transport.inprocess import InProcessServer
from seedbed.types import ReplayInfo
from tests.agents.test_agents import DISCRETE, collect
from tests.conftest import tiny_settings

NUM_ENVS = 4


@contextlib.contextmanager
def one_thread():
    """Both sides on one torch thread: the same reductions in the same order, so bit for bit."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def learner(agent_name: str, process: bool, config, learned: list):
    """Inline updates or a learner process for a fresh ``agent_name`` (seed 0), publishing to a
    real inference server."""
    torch.manual_seed(0)
    agent = make_agent(agent_name, DISCRETE, config.agent, "cpu", NUM_ENVS)
    server = InferenceServer(
        agent, InProcessServer(1, NUM_ENVS), UnrollQueue(8), NUM_ENVS, (6, 1), NUM_ENVS, 0.0, "cpu"
    )
    publisher = PolicyPublisher(agent, server, None, "fp32", 1)
    buffer = UnrollQueue(8)
    if process:
        updates = LearnerProcess(config, DISCRETE, agent, buffer, publisher, 0, 1, learned.append)
    else:
        train_cfg = config.train
        rates = LearningRates(
            agent.optimizers(),
            train_cfg.lr_schedule,
            train_cfg.total_frames,
            train_cfg.lr_hold_frames,
        )
        updates = InlineUpdates(
            agent, buffer, publisher, torch.device("cpu"), rates, 0, learned.append, Stopwatch()
        )
    return agent, server, updates


def batches(agent_name: str, config, count: int = 4):
    torch.manual_seed(1)
    agent = make_agent(agent_name, DISCRETE, config.agent, "cpu", NUM_ENVS)
    out = [collect(agent, DISCRETE, num_envs=NUM_ENVS) for _ in range(count)]
    if agent_name == "dqn":  # as sampled from replay: weights in, priorities back
        for batch in out:
            weights = torch.rand(NUM_ENVS)
            ids = torch.arange(NUM_ENVS)
            batch.replay = ReplayInfo(ids, weights / weights.max(), torch.zeros_like(ids))
    return out


def assert_same_tensors(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_tensors(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tensors(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("agent_name", ["ppo", "vtrace", "dqn"])
def test_a_learner_process_makes_the_same_updates_as_the_loop(agent_name, no_leaks):
    """The same batches, at the same frame counts: the same parameters (as published to
    inference), metrics, optimizer state and, from replay, priorities."""
    settings = {"agent": agent_name, "hidden_sizes": "8", "total_frames": 4000}
    config = resolve([{**settings, "lr_schedule": "linear"}])
    frames = [0, 1000, 2000, 3000]  # the learning rates fall over these
    runs = {}
    with one_thread():
        for process in (False, True):
            learned = []
            agent, server, updates = learner(agent_name, process, config, learned)
            submitted = batches(agent_name, config)
            try:
                for batch, frame in zip(submitted, frames, strict=True):
                    while not updates.ready():
                        updates.wait(0.05)
                    updates.submit(batch, frame)
                updates.wait_all()
                state = updates.agent_state()
            finally:
                updates.close()
            runs[process] = (agent, server, learned, state, submitted)
    (inline, in_process) = runs[False], runs[True]
    assert len(inline[2]) == len(in_process[2]) == 4
    for a, b in zip(inline[2], in_process[2], strict=True):
        assert a.metrics == b.metrics and a.policy_lag == b.policy_lag
    assert in_process[2][-1].metrics["lr_fraction"] < 1.0  # the schedule ran in the process
    for network in (in_process[0].network, in_process[1].net):  # the mirror and inference's copy
        assert_same_tensors(inline[0].network.state_dict(), network.state_dict())
    assert in_process[1].version == 4
    assert_same_tensors(inline[3], in_process[3])
    if agent_name == "dqn":
        for a, b in zip(inline[4], in_process[4], strict=True):
            assert a.replay.priorities is not None
            assert torch.equal(a.replay.priorities.float(), b.replay.priorities)


def test_a_failing_update_is_one_line(no_leaks):
    config = resolve([{"agent": "ppo", "hidden_sizes": "8"}])
    agent, _, updates = learner("ppo", True, config, [])
    batch = collect(agent, DISCRETE, num_envs=NUM_ENVS)
    batch.steps["obs"] = batch.steps["obs"][..., :3]  # not what the network reads
    try:
        updates.submit(batch, 0)
        with pytest.raises(SeedbedError, match="^the learner process failed: RuntimeError"):
            updates.wait_all()
    finally:
        updates.close()


def test_a_killed_learner_process_stops_the_run_with_one_line(no_leaks):
    config = resolve([{"agent": "ppo", "hidden_sizes": "8"}])
    agent, _, updates = learner("ppo", True, config, [])
    try:
        updates._process.kill()
        updates._process.join(10)
        with pytest.raises(SeedbedError, match="learner process ended unexpectedly.*--resume"):
            updates.submit(collect(agent, DISCRETE, num_envs=NUM_ENVS), 0)
            updates.wait_all()
    finally:
        updates.close()


def test_a_run_with_a_learner_process_checkpoints_and_resumes(tmp_path, no_leaks):
    run = tmp_path / "run"
    first = train(resolve([tiny_settings(run, agent="ppo", learner_process=True)]))
    assert first["stop_reason"] == "total_frames" and first["learner_steps"] > 0
    shares = first["time_shares"]
    assert shares["learner"]["learning"] > 0 and "waiting_for_learner" in shares["learner_loop"]
    saved = load_checkpoint(first["checkpoint"])
    assert saved["learner_steps"] == first["learner_steps"]
    second = train(
        resolve(
            [tiny_settings(run, agent="ppo", learner_process=True, total_frames=6000, resume=True)]
        )
    )
    assert second["frames"] >= 6000 and second["learner_steps"] > first["learner_steps"]
    # The process resumed from the checkpoint's optimizer state, not a fresh one.
    resumed = load_checkpoint(second["checkpoint"])["agent"]["optimizer"]["state"]
    first_steps = saved["agent"]["optimizer"]["state"][0]["step"]
    assert resumed[0]["step"] > first_steps


@pytest.mark.slow
def test_ppo_with_a_learner_process_solves_cartpole(tmp_path, no_leaks):
    settings = {
        "learner_process": True,
        "run_dir": str(tmp_path / "run"),
        "progress": False,
        "target_return": 475.0,
        "total_frames": 1_000_000,
    }
    summary = train(resolve([settings]))
    assert summary["stop_reason"] == "target_return", summary


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"learner_replicas": 2}, "works with one learner replica"),
        ({"device": "cuda"}, "for CPU runs for now"),
    ],
)
def test_a_learner_process_refuses_what_it_cannot_serve(settings, message):
    with pytest.raises(ConfigError, match=message):
        resolve([{"learner_process": True, **settings}])
