"""Local inference over every registered transport backend: what actors acted travels with their
steps, the policy board, the actor's own policy, and the server recording instead of acting."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch

from seedbed.actor import act
from seedbed.actor.local import LocalActing, LocalPolicy, acted_fields
from seedbed.agents import make_agent
from seedbed.envs import make_spec, make_vector_env
from seedbed.inference.server import InferenceServer
from seedbed.quantize import encode_policy
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.transport import backend
from seedbed.transport.base import Request, TransportSpec
from seedbed.transport.inprocess import InProcessServer
from seedbed.types import EnvSpec
from tests.transport.backends import Harness, each_backend, exit_code, start

SPEC = EnvSpec("test", (3,), "float32", 2)
FIELDS = (("action", (), "int64"), ("version", (), "int64"), ("logits", (2,), "float32"))
STEPS = 20


def _acted(actor: int, t: int, envs: int) -> dict[str, np.ndarray]:
    rows = np.arange(envs) + 10 * actor
    return {
        "action": (rows + t) % 2,
        "version": np.full(envs, t, np.int64),
        "logits": np.stack([rows + t, -rows - t], axis=1).astype(np.float32),
    }


def _local_actor(endpoint, actor: int, envs: int) -> None:
    """Submit STEPS steps with what was acted, collecting each answer before the next."""
    client = endpoint.open()
    for t in range(STEPS):
        obs = np.full((envs, 3), t, np.float32)
        client.submit(obs, np.zeros(envs, np.float32), np.zeros(envs, bool), np.zeros(envs, bool),
                      _acted(actor, t, envs))  # fmt: skip
        client.collect()
    client.close()


@each_backend
def test_what_actors_acted_travels_with_their_steps(name, no_leaks):
    actors, envs = 2, 3
    b = Harness(name, TransportSpec(actors, envs, (3,), "float32", acted=FIELDS))
    server = b.server
    try:
        for actor in range(actors):
            b.launch(actor, _local_actor, envs)
        served = 0
        while served < actors * envs * STEPS:
            request = server.recv(actors * envs, 0.01)
            if request is None:
                continue
            for actor in np.unique(request.env_ids // envs):
                mine = request.env_ids // envs == actor
                t = int(request.obs[mine][0, 0])
                for field, want in _acted(int(actor), t, envs).items():
                    np.testing.assert_array_equal(request.acted[field][mine], want)
            served += len(request.env_ids)
            server.send(request, request.acted["action"])
        assert b.exit_codes() == [0] * actors
    finally:
        server.close()


def _reader(handle, posts: int, bad) -> None:
    board = handle.open()
    seen = -1
    while seen < posts - 1:
        post = board.read(seen)
        if post is None:
            continue
        payload, version = post
        # A post v holds v+1 bytes of value v % 251: a torn read would mix two posts.
        if len(payload) != version + 1 or set(payload) != {version % 251} or version <= seen:
            bad.value = 1
        seen = version
    board.close()


@each_backend
def test_the_policy_board_never_gives_a_torn_or_old_post(name, no_leaks):
    posts = 2000
    board = backend(name).make_board(posts)
    bad = multiprocessing.get_context("spawn").Value("b", 0)
    own = board.handle.open()  # the learner's own reader
    try:
        assert own.read(-1) is None  # nothing posted yet
        reader = start(name, _reader, board.handle, posts, bad)
        for version in range(posts):
            board.post(bytes([version % 251]) * (version + 1), version)
        assert exit_code(reader, 60) == 0 and bad.value == 0
        assert own.read(posts - 1) is None  # nothing newer
        with pytest.raises(ValueError, match="exceeds the board"):
            board.post(b"x" * (posts + 1), posts)
    finally:
        own.close()
        board.close()


def _agent(hidden: str = "8", **settings):
    config = resolve([{"hidden_sizes": hidden, **settings}])
    return make_agent(config.train.agent, SPEC, config.agent, "cpu", 8), config


@each_backend
@pytest.mark.parametrize("lstm", [False, True])
def test_an_actors_policy_acts_with_the_newest_broadcast(name, lstm, no_leaks):
    torch.manual_seed(0)
    agent, config = _agent(hidden="256,256", lstm=lstm, lstm_size=8)
    skip = agent.acting_skips  # the policy alone travels, as the learner posts it
    board = backend(name).make_board(len(encode_policy(agent.network, "fp32", 0, skip)) + 64)
    try:
        board.post(encode_policy(agent.network, "int8", 3, skip), 3)
        acting = LocalActing("vtrace", config.agent, SPEC, 8, board.handle)
        policy = LocalPolicy(acting, first_env=4, num_envs=2, seed=1)
        obs = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
        acted = policy.act(obs, np.zeros(2, np.float32), np.ones(2, bool))
        fields = {name: (shape, dtype) for name, shape, dtype in acted_fields(agent, SPEC)}
        assert set(acted) == set(fields)
        for name, value in acted.items():
            assert value.shape == (2, *fields[name][0]) and value.dtype == fields[name][1], name
        assert acted["version"].tolist() == [3, 3] and policy.version == 3
        assert set(acted["action"].tolist()) <= {0, 1}
        board.post(encode_policy(agent.network, "fp16", 7, skip), 7)
        policy.act(obs, np.zeros(2, np.float32), np.zeros(2, bool))
        assert policy.version == 7
        policy.close()
    finally:
        board.close()


def test_the_server_records_what_local_actors_acted():
    agent, _ = _agent()
    transport = InProcessServer(num_actors=1, envs_per_actor=2)
    transport.connect(0)
    queue = UnrollQueue(10)
    server = InferenceServer(agent, transport, queue, 2, (2, 1), 2, 0.0, "cpu")
    for t in range(3):
        acted = _acted(0, t, 2)
        acted["version"] = np.array([t, 5 + t])  # each env acted with its own version
        server.step(
            Request(
                env_ids=np.array([0, 1]),
                obs=np.full((2, 3), t, np.float32),
                reward=np.ones(2, np.float32),
                done=np.array([t == 0] * 2),
                truncated=np.zeros(2, bool),
                run_id=np.array([1, 1]),
                route=[(0, transport._generation[0])],
                acted=acted,
            )
        )
    unrolls = queue.get(2, timeout=1)
    want = [_acted(0, t, 2) for t in range(3)]
    assert unrolls.steps["action"].tolist() == [w["action"].tolist() for w in want]
    assert unrolls.steps["logits"].tolist() == [w["logits"].tolist() for w in want]
    assert unrolls.steps["prev_action"][1:].tolist() == unrolls.steps["action"][:-1].tolist()
    assert unrolls.policy_version.tolist() == [0, 5]


@each_backend
def test_the_publisher_measures_the_first_broadcast_after_each_metrics_row(name, no_leaks):
    from seedbed.inference.publish import PolicyPublisher
    from seedbed.quantize import decode_policy, policy_error
    from seedbed.types import StepInput, Unrolls

    torch.manual_seed(0)
    agent, _ = _agent(hidden="256,256")
    net, skip = agent.network, agent.acting_skips
    board = backend(name).make_board(len(encode_policy(net, "fp32", 0, skip)) + 64)
    reader = board.handle.open()
    steps = {
        "obs": torch.randn(2, 8, 3),
        "prev_action": torch.zeros(2, 8, dtype=torch.int64),
        "reward": torch.zeros(2, 8),
        "done": torch.ones(2, 8, dtype=torch.bool),
    }
    batch = Unrolls(steps, (), torch.zeros(8, dtype=torch.int64))
    first = (steps[k][0] for k in ("obs", "prev_action", "reward", "done"))
    probe = (StepInput(*first, torch.arange(8)), ())  # the first step of every unroll
    try:
        publisher = PolicyPublisher(agent, None, board, "int8", every=1)
        for row in range(2):
            expected = None
            for version in range(3 * row + 1, 3 * row + 4):  # 3 broadcasts per row
                with torch.no_grad():
                    for p in net.parameters():
                        p.mul_(1.5)  # each broadcast quantizes a different policy
                publisher.publish(version, batch)
                payload, posted = reader.read(version - 1)
                assert posted == version  # every due broadcast is posted
                if expected is None:
                    decoded = decode_policy(payload, net, skip)[0]
                    expected = policy_error(net, decoded, agent.acting_outputs, probe)
            metrics = publisher.take()
            assert metrics["quantization_error"] == pytest.approx(expected, rel=1e-6)
            assert metrics["broadcast_bytes"] == len(payload)
    finally:
        reader.close()
        board.close()


def _acting_actor(endpoint, actor: int, acting: LocalActing, envs: int) -> None:
    """A local actor as ``run_actor`` runs one, minus its signal handlers (it may be a thread):
    it acts with the board's policy until the learner goes away."""
    client = endpoint.open()
    vec = make_vector_env("CartPole-v1", envs, actor, None)
    policy = LocalPolicy(acting, actor * envs, envs, seed=actor)
    try:
        act(client, vec, actor, policy)
    except ConnectionError:
        pass  # the learner closed the transport: the run is over
    finally:
        client.close()
        vec.close()
        policy.close()


@each_backend
def test_local_actors_act_through_each_backend_and_the_server_records_them(name, no_leaks):
    """Real local actors (``act`` with a ``LocalPolicy``) over the backend, as in a run: the
    unrolls the server records carry the posted policy's version and valid actions."""
    threads = torch.get_num_threads()  # an actor thread sets its own count to 1
    torch.manual_seed(0)
    spec = make_spec("CartPole-v1")
    actors, envs, version = 2, 2, 5
    config = resolve([{"agent": "vtrace", "hidden_sizes": "8"}])
    agent = make_agent("vtrace", spec, config.agent, "cpu", actors * envs)
    acted = acted_fields(agent, spec)
    transport = TransportSpec(actors, envs, spec.obs_shape, spec.obs_dtype, acted=acted)
    b = Harness(name, transport)
    skip = agent.acting_skips
    board = backend(name).make_board(len(encode_policy(agent.network, "fp32", 0, skip)) + 64)
    board.post(encode_policy(agent.network, "fp32", version, skip), version)
    queue = UnrollQueue(100)
    layout = agent.unroll_layout(4)
    server = InferenceServer(agent, b.server, queue, actors * envs, layout, 4, 0.002, "cpu")
    try:
        acting = LocalActing("vtrace", config.agent, spec, actors * envs, board.handle)
        for actor in range(actors):
            b.launch(actor, _acting_actor, acting, envs)
        unrolls = None
        while unrolls is None:
            request = b.server.recv(actors * envs, 0.002)
            if request is not None:
                assert request.acted is not None and set(request.acted) == {n for n, *_ in acted}
                server.step(request)
            unrolls = queue.get(2 * actors * envs, timeout=0)
        assert unrolls.policy_version.tolist() == [version] * (2 * actors * envs)
        assert set(unrolls.steps["action"].reshape(-1).tolist()) <= {0, 1}
    finally:
        b.server.close()
        codes = b.exit_codes()
        board.close()
        torch.set_num_threads(threads)
    assert codes == [0] * actors
