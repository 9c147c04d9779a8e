"""Steps the inference server refuses (``seedbed.transport.checks``): NaN or inf anywhere an
actor sends values, absurd rewards and returns, actions outside the action space. The env
starts over, what it sent never reaches an unroll or the returns, and the other envs go on."""

from __future__ import annotations

import numpy as np
import torch

from seedbed.actor.local import acted_fields
from seedbed.agents import make_agent
from seedbed.inference.server import InferenceServer
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.transport.base import Request
from seedbed.transport.inprocess import InProcessServer
from seedbed.types import EnvSpec

SPEC = EnvSpec("test", (3,), "float32", 2)


def make_server(unroll: int = 2):
    config = resolve([{"lstm": True, "lstm_size": 8, "hidden_sizes": "8"}])
    agent = make_agent("vtrace", SPEC, config.agent, "cpu")
    transport = InProcessServer(num_actors=1, envs_per_actor=2)
    queue = UnrollQueue(100)
    server = InferenceServer(
        agent, transport, queue, 2, (unroll, 1), 2, 0.0, "cpu", num_actions=SPEC.num_actions
    )
    transport.connect(0)
    return server, transport, queue


def request(transport, t: int, obs=None, reward=(1.0, 1.0), done=(False, False), acted=None):
    return Request(
        env_ids=np.array([0, 1]),
        obs=np.full((2, 3), t, np.float32) if obs is None else np.asarray(obs, np.float32),
        reward=np.array(reward, np.float32),
        done=np.array(done),
        truncated=np.zeros(2, bool),
        run_id=np.array([1, 1]),
        route=[(0, transport._generation[0])],
        acted=acted,
    )


def drain(queue) -> list:
    out = []
    while len(queue):
        out.append(queue.get(1, timeout=0))
    return out


def test_a_nan_observation_is_refused_and_its_env_starts_over():
    server, transport, queue = make_server()
    server.step(request(transport, 0, done=(True, True)))
    server.step(request(transport, 1))
    server.step(request(transport, 2, obs=[[2, 2, 2], [np.nan, 2, 2]]))  # env 1 only
    for t in range(3, 8):
        server.step(request(transport, t))
    seen = []  # (the steps an unroll holds, whether it starts an episode), every env's
    for u in drain(queue):
        assert torch.isfinite(u.steps["obs"]).all() and torch.isfinite(u.steps["reward"]).all()
        for i in range(u.steps["obs"].shape[1]):
            seen.append((u.steps["obs"][:, i, 0].long().tolist(), bool(u.steps["done"][0, i])))
    assert ([0, 1, 2], True) in seen and ([2, 3, 4], False) in seen  # env 0 went on
    assert ([3, 4, 5], True) in seen  # env 1 started over the step after, as a new episode
    assert server.refused_steps.tolist() == [0, 1]
    assert server.stats.resets == 2  # both at the start: a refusal is no actor restart


def test_absurd_rewards_and_returns_never_reach_the_episode_returns():
    server, transport, _ = make_server(unroll=50)
    server.step(request(transport, 0, done=(True, True), reward=(0, 0)))
    server.step(request(transport, 1, reward=(np.inf, 4e29)))
    server.step(request(transport, 2, reward=(3e38, 4e29)))
    server.step(request(transport, 3, reward=(2.0, 4e29), done=(True, True)))
    server.step(request(transport, 4, reward=(5.0, 1.0), done=(True, True)))
    stats = server.take_stats()
    # env 0: steps 1 and 2 refused, so it restarts at 3 (its reward there ends nothing); its
    # next episode is the one step 4 ends. env 1's 1.2e30 is over the bound; its next is 1.0.
    assert stats.episode_returns == [5.0, 1.0]
    assert server.refused_steps.tolist() == [2, 0] and server.refused_returns == 1
    assert all(np.isfinite(stats.episode_returns))


def test_what_local_actors_acted_is_checked_before_it_is_recorded():
    server, transport, queue = make_server()
    fields = acted_fields(server.agent, SPEC)
    names = [name for name, _, _ in fields]
    assert "action" in names and "logits" in names and "state0" in names

    def acted(t: int, **bad) -> dict[str, np.ndarray]:
        out = {n: np.zeros((2, *shape), np.dtype(dtype)) for n, shape, dtype in fields}
        out["action"][:] = t % 2
        for name, (row, value) in bad.items():
            out[name][row] = value
        return out

    server.step(request(transport, 0, done=(True, True), acted=acted(0)))
    server.step(request(transport, 1, acted=acted(1, action=(0, 7))))  # no action 7
    server.step(request(transport, 2, acted=acted(2, action=(1, -1))))
    server.step(request(transport, 3, acted=acted(3, logits=(0, np.nan))))
    server.step(request(transport, 4, acted=acted(4, state0=(1, np.inf))))
    for t in range(5, 12):
        server.step(request(transport, t, acted=acted(t)))
    assert server.refused_steps.tolist() == [2, 2]
    for u in drain(queue):
        action = u.steps["action"]
        assert ((action >= 0) & (action < 2)).all()
        assert torch.isfinite(u.steps["logits"]).all()
        assert all(torch.isfinite(s).all() for s in u.initial_state)
    assert ((server.table.prev_action >= 0) & (server.table.prev_action < 2)).all()
