"""Frame stacks kept by the learner equal the stacks Atari actors build themselves.

The same game is played twice with the same seeds and actions, across episode ends and an actor
restart: once with the actors' envs stacking 4 frames, once sending 1 frame with the learner
stacking. The network's inputs (the acting table's stacks), the agent's outputs on them, and
the learner's rebuilt unrolls must equal the actor-side ones, step for step.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from seedbed.agents import make_agent
from seedbed.envs import make_spec, make_vector_env
from seedbed.envs.atari import AtariSettings
from seedbed.framestack import restack
from seedbed.inference.acting import ActingTable
from seedbed.inference.server import InferenceServer
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.transport.base import Request
from seedbed.transport.inprocess import InProcessServer

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
ENVS, STEPS, RESTART = 2, 75, 47  # the actor restarts before step RESTART
EPISODE_FRAMES = 100  # episodes end every 25 agent steps


def settings(stack_on: str, backend: str = "gymnasium") -> AtariSettings:
    return AtariSettings(
        env_backend=backend, frame_stack_on=stack_on, max_episode_frames=EPISODE_FRAMES
    )


def play(stack_on: str, backend: str = "gymnasium") -> list[tuple[np.ndarray, ...]]:
    """Each step an actor sends (obs, reward, done, truncated, run id), playing fixed actions;
    before step RESTART it restarts (new envs, seed and run id) claiming no episode start, as
    only the server's run id check knows better."""
    actions = np.random.default_rng(0).integers(0, 6, (STEPS, ENVS))
    sent, run = [], 1
    envs = make_vector_env("atari:Pong", ENVS, 3, settings(stack_on, backend))
    obs, _ = envs.reset(seed=3)
    reward, done = np.zeros(ENVS, np.float32), np.ones(ENVS, bool)
    truncated = np.zeros(ENVS, bool)
    try:
        for t in range(STEPS):
            if t == RESTART:
                envs.close()
                envs, run = make_vector_env("atari:Pong", ENVS, 4, settings(stack_on, backend)), 2
                obs, _ = envs.reset(seed=4)
                reward, done = np.zeros(ENVS, np.float32), np.zeros(ENVS, bool)
            sent.append((obs.copy(), reward, done, truncated, np.full(ENVS, run)))
            obs, reward, terminated, truncated, _ = envs.step(actions[t])
            done = terminated | truncated
    finally:
        envs.close()
    return sent


@pytest.fixture(scope="module")
def games() -> dict[str, list[tuple[np.ndarray, ...]]]:
    played = {on: play(on) for on in ("actor", "learner")}
    ends = sum(int(step[2].sum()) for step in played["actor"][1:RESTART])
    assert ends >= ENVS, "the game must cross an episode end before the restart"
    return played


def test_actors_send_one_frame_and_the_spec_still_describes_the_stack(games):
    actor, learner = games["actor"], games["learner"]
    assert actor[0][0].shape == (ENVS, 4, 84, 84) and learner[0][0].shape == (ENVS, 1, 84, 84)
    for a, b in zip(actor, learner, strict=True):
        assert np.array_equal(a[0][:, -1:], b[0])  # the newest frames are the same game
    spec = make_spec("atari:Pong", settings("learner"))
    assert spec.obs_shape == (4, 84, 84) and spec.learner_stack == 4
    assert spec.sent_obs_shape == (1, 84, 84)
    assert make_spec("atari:Pong", settings("actor")).sent_obs_shape == (4, 84, 84)


def test_the_acting_tables_stacks_are_the_actor_side_stacks(games):
    assert_same_network_inputs(games["actor"], games["learner"])


@pytest.mark.skipif(not HAS_ENVPOOL, reason="EnvPool has no wheel for this platform")
def test_the_acting_tables_stacks_are_envpools_too():
    """EnvPool pads its stacks at reset as Gymnasium does: the first frame repeated."""
    assert_same_network_inputs(play("actor", "envpool"), play("learner", "envpool"))


def assert_same_network_inputs(actor: list, learner: list) -> None:
    """What the agent acts on, from an acting table fed single frames, is the actor's stack."""
    assert sum(int(step[2].sum()) for step in learner[1:RESTART]) >= ENVS  # episodes ended
    table = ActingTable(lambda n: (), ENVS, frame_stack=4)
    run = np.full(ENVS, -1)
    for (stacked, *_), (frame, reward, done, _, run_id) in zip(actor, learner, strict=True):
        assert np.array_equal(stacked[:, -1:], frame)  # the same game, one frame sent
        starts = torch.from_numpy(done | (run_id != run))  # a restart starts an episode
        run = run_id
        step, _ = table.inputs(
            torch.arange(ENVS), torch.from_numpy(frame), torch.from_numpy(reward), starts
        )
        assert torch.equal(step.obs, torch.from_numpy(stacked))


def serve(game: list[tuple[np.ndarray, ...]], stack_on: str, agent_name: str) -> tuple:
    """Every step of ``game`` through a central inference server over the in-process transport;
    the unrolls it cut (rebuilt as the learner loop rebuilds them) and its actions."""
    spec = make_spec("atari:Pong", settings(stack_on))
    config = resolve([{"env": "atari:Pong", "agent": agent_name, "unroll": 8}])
    torch.manual_seed(0)  # the same network, and the same sampled actions on the same inputs
    agent = make_agent(agent_name, spec, config.agent, "cpu", ENVS)
    transport, queue = InProcessServer(num_actors=1, envs_per_actor=ENVS), UnrollQueue(1000)
    server = InferenceServer(
        agent,
        transport,
        queue,
        ENVS,
        agent.unroll_layout(8),
        ENVS,
        0.0,
        "cpu",
        frame_stack=spec.learner_stack,
    )
    generation, run = None, None
    for obs, reward, done, truncated, run_id in game:
        if run_id[0] != run:
            transport.connect(0)  # a new generation of actor slot 0
            generation, run = transport._generation[0], run_id[0]
        ids = np.arange(ENVS)
        server.step(Request(ids, obs, reward, done, truncated, run_id, route=[(0, generation)]))
    assert server.stats.resets == 2 * ENVS  # the first start and the restart
    return restack(queue.get(len(queue))), server


@pytest.mark.parametrize("agent_name", ["vtrace", "dqn"])  # unrolls overlapping by 1 and by 3
def test_central_inference_acts_and_learns_on_the_same_stacks(games, agent_name):
    actor, actor_server = serve(games["actor"], "actor", agent_name)
    learner, learner_server = serve(games["learner"], "learner", agent_name)
    assert learner_server.builder.overlap == (1 if agent_name == "vtrace" else 3)
    assert actor.obs_context is None and learner.obs_context is None  # restacked
    assert set(learner.steps) == set(actor.steps)
    for key in learner.steps:  # obs, done, actions and the agent's outputs
        assert torch.equal(learner.steps[key], actor.steps[key]), key
    assert learner.steps["obs"].shape[2:] == (4, 84, 84) and learner.batch_size >= 2 * ENVS
    assert torch.equal(learner_server.table.prev_action, actor_server.table.prev_action)
