"""The inference server with a real V-trace agent: state per env, unrolls, restarts, episodes."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
import torch

from seedbed.agents import make_agent
from seedbed.inference.server import InferenceServer
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.transport.base import Request
from seedbed.transport.inprocess import InProcessServer
from seedbed.types import EnvSpec

SPEC = EnvSpec("test", (3,), "float32", 2)


def make_server(lstm: bool = True, unroll: int = 2, frames_per_step: int = 1):
    config = resolve([{"lstm": lstm, "lstm_size": 8, "hidden_sizes": "8"}])
    agent = make_agent("vtrace", SPEC, config.agent, "cpu")
    transport = InProcessServer(num_actors=1, envs_per_actor=2)
    queue = UnrollQueue(100)
    server = InferenceServer(
        agent, transport, queue, 2, (unroll, 1), 2, 0.0, "cpu", frames_per_step=frames_per_step
    )
    return server, transport, queue


def request(
    transport, t: float, run: int, done=(False, False), reward=(1.0, 1.0), truncated=(0, 0)
) -> Request:
    gen = transport._generation[0]
    return Request(
        env_ids=np.array([0, 1]),
        obs=np.full((2, 3), t, np.float32),
        reward=np.array(reward, np.float32),
        done=np.array(done),
        truncated=np.array(truncated, bool),
        run_id=np.array([run, run]),
        route=[(0, gen)],
    )


def test_state_is_kept_per_env_and_reset_on_restart():
    server, transport, queue = make_server()
    transport.connect(0)
    server.step(request(transport, 0, run=1, done=(True, True), reward=(0, 0)))
    server.step(request(transport, 1, run=1))
    assert server.table.state[0].abs().sum() > 0  # the LSTM state moved on
    server.step(request(transport, 2, run=1))
    unrolls = queue.get(2, timeout=1)
    assert unrolls.steps["obs"][:, :, 0].T.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert unrolls.steps["done"][0].all() and not unrolls.steps["done"][1:].any()
    assert all(s.abs().sum() == 0 for s in unrolls.initial_state)  # fresh episodes
    server.step(request(transport, 3, run=1))
    # The actor restarts: new run id. Its envs start over, whatever the actor claims.
    server.step(request(transport, 4, run=2, done=(False, False)))
    assert server.stats.resets == 4  # two envs at the first start, two at the restart
    server.step(request(transport, 5, run=2))
    server.step(request(transport, 6, run=2))
    unrolls = queue.get(2, timeout=1)
    assert unrolls.steps["obs"][:, 0, 0].tolist() == [4, 5, 6]  # steps 2-3 of run 1 are dropped
    assert unrolls.steps["done"][0].all()
    assert (unrolls.steps["prev_action"][0] == 0).all()
    assert all(s.abs().sum() == 0 for s in unrolls.initial_state)


def test_episode_returns_are_raw_and_counted_once():
    server, transport, _ = make_server(lstm=False, unroll=50)
    transport.connect(0)
    server.step(request(transport, 0, run=1, done=(True, True), reward=(0, 0)))
    for t in range(1, 4):
        server.step(request(transport, t, run=1, reward=(2.5, -1.0)))
    server.step(request(transport, 4, run=1, done=(True, False), reward=(10.0, 1.0)))
    stats = server.take_stats()
    assert stats.episode_returns == [2.5 * 3 + 10.0]
    assert stats.episode_lengths == [4]
    assert stats.frames == 8  # the first step of a new run is not an env frame


def test_frames_count_emulator_frames_per_agent_step():
    server, transport, _ = make_server(lstm=False, unroll=50, frames_per_step=4)
    transport.connect(0)
    for t in range(5):
        server.step(request(transport, t, run=1, done=(t == 0, t == 0)))
    assert server.take_stats().frames == 4 * 2 * 4  # 4 counted steps of 2 envs, 4 frames each


def test_acting_uses_published_parameters():
    server, transport, queue = make_server(lstm=False, unroll=1)
    transport.connect(0)
    with torch.no_grad():
        for p in server.agent.network.parameters():
            p.zero_()
        server.agent.network.policy.bias.copy_(torch.tensor([0.0, 50.0]))
    server.publish(server.agent.network, version=7)
    server.step(request(transport, 0, run=1, done=(True, True)))
    server.step(request(transport, 1, run=1))
    unrolls = queue.get(2, timeout=1)
    assert (unrolls.steps["action"] == 1).all()
    assert unrolls.policy_version.tolist() == [7, 7]


def test_truncation_reaches_the_unroll_but_not_for_a_restart():
    server, transport, queue = make_server(lstm=False, unroll=2)
    transport.connect(0)
    # A restart's first step is a new episode, never a time-limit cut, whatever the flag says.
    server.step(request(transport, 0, run=1, done=(True, True), truncated=(1, 1)))
    server.step(request(transport, 1, run=1))
    server.step(request(transport, 2, run=1, done=(True, True), truncated=(1, 0)))
    unrolls = queue.get(2, timeout=1)
    assert unrolls.steps["truncated"].T.tolist() == [[False, False, True], [False, False, False]]


def test_continuous_actions_are_kept_and_recorded_as_float32_vectors():
    spec = EnvSpec(
        "test",
        (3,),
        "float32",
        0,
        action_shape=(2,),
        action_dtype="float32",
        action_low=(-1.0, -1.0),
        action_high=(1.0, 1.0),
    )
    config = resolve([{"env": "dmc:cartpole-balance", "agent": "d4pg"}])
    agent = make_agent("d4pg", spec, config.agent, "cpu", num_envs=2)
    transport = InProcessServer(num_actors=1, envs_per_actor=2)
    queue = UnrollQueue(100)
    server = InferenceServer(
        agent, transport, queue, 2, (2, 1), 2, 0.0, "cpu", action_shape=(2,), action_dtype="float32"
    )
    transport.connect(0)
    for t in range(3):
        server.step(request(transport, t, run=1, done=(t == 0, t == 0)))
    unrolls = queue.get(2, timeout=1)
    action, prev = unrolls.steps["action"], unrolls.steps["prev_action"]
    assert action.shape == prev.shape == (3, 2, 2) and action.dtype == prev.dtype == torch.float32
    assert (prev[0] == 0).all() and torch.equal(prev[1:], action[:-1])
    assert not torch.equal(action[0].round(), action[0])  # real-valued, not cast to integers
    kept = server.table.prev_action
    assert kept.shape == (2, 2) and torch.equal(kept, action[-1])


def _stepping_actor(endpoint, steps: int, envs: int, frame: int) -> None:
    """An actor thread whose envs' observations say which env and step they are."""
    client = endpoint.open()
    ids = endpoint.actor * envs + np.arange(envs)
    try:
        for t in range(steps):
            obs = np.zeros((envs, frame), np.uint8 if frame == 2 else np.float32)
            obs[:, 0], obs[:, 1] = ids, t
            done = np.full(envs, t == 0)
            client.call(obs, np.ones(envs, np.float32), done, np.zeros(envs, bool))
    finally:
        client.close()


@pytest.mark.parametrize("stack", [1, 2])
def test_several_serving_threads_keep_each_envs_state_and_unrolls(stack):
    """Three threads serve four actors at once: every env's recurrent state (and frame stack)
    goes from each step to its next, and its unrolls hold its own steps in order."""
    actors, envs, steps, unroll = 4, 3, 30, 4
    spec = EnvSpec("test", (3 if stack == 1 else 2 * stack,), SPEC.obs_dtype, 2)
    if stack > 1:
        spec = EnvSpec("test", (2 * stack,), "uint8", 2, learner_stack=stack)
    config = resolve([{"lstm": True, "lstm_size": 8, "hidden_sizes": "8"}])
    agent = make_agent("vtrace", spec, config.agent, "cpu", actors * envs)
    transport = InProcessServer(actors, envs)
    queue = UnrollQueue(10_000)
    server = InferenceServer(
        agent,
        transport,
        queue,
        actors * envs,
        (unroll, 1),
        2 * envs,
        0.001,
        "cpu",
        frame_stack=stack,
    )
    acted, real_act = [], agent.act

    def logged_act(net, step, state):  # called under the server's parameters lock
        out = real_act(net, step, state)
        acted.append((threading.get_ident(), step.env_ids.clone(), step.obs.clone(), state, out))
        return out

    agent.act = logged_act
    endpoints = [transport.connect(a) for a in range(actors)]
    stop = threading.Event()
    serving = [threading.Thread(target=server.serve, args=(stop,)) for _ in range(3)]
    frame = spec.sent_obs_shape[0]
    stepping = [
        threading.Thread(target=_stepping_actor, args=(e, steps, envs, frame)) for e in endpoints
    ]
    for thread in serving + stepping:
        thread.start()
    for thread in stepping:
        thread.join(timeout=60)
    stop.set()
    for thread in serving:
        thread.join(timeout=10)

    assert len({thread for thread, *_ in acted}) > 1  # the threads did share the work
    by_env = {}  # env -> [(t, obs the agent saw, state before, state after, action)]
    for _, ids, obs, before, out in acted:
        for i, env in enumerate(ids.tolist()):
            t = int(obs[i, -frame + 1])  # the newest frame's step counter
            after = tuple(s[i] for s in out.state)
            by_env.setdefault(env, []).append((t, obs[i], before[0][i], after, out.action[i]))
    assert sorted(by_env) == list(range(actors * envs))
    for seen in by_env.values():
        assert [t for t, *_ in seen] == list(range(steps))  # each step once, in order
        for (_, obs, _, after, _), (_, next_obs, next_before, _, _) in itertools.pairwise(seen):
            assert torch.equal(next_before, after[0])  # the state it left is the one it resumes
            if stack > 1:  # the older frame of the next stack is this step's newest frame
                assert next_obs[:frame].tolist() == obs[frame:].tolist()
    cut = []
    while len(queue):
        cut.append(queue.get(1, timeout=0))
    assert len(cut) == actors * envs * ((steps - 1) // unroll)
    for u in cut:
        obs, env = u.steps["obs"][:, 0], int(u.steps["obs"][0, 0, 0])
        ts = obs[:, 1].long().tolist()
        assert ts == list(range(ts[0], ts[0] + unroll + 1)) and (obs[:, 0] == env).all()
        first = by_env[env][ts[0]]
        assert torch.equal(u.initial_state[0][0], first[2])
        actions = torch.stack([by_env[env][t][4] for t in ts])
        assert torch.equal(u.steps["action"][:, 0], actions)
        assert torch.equal(u.steps["prev_action"][1:, 0], actions[:-1])
