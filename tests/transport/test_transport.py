"""One suite for every registered transport backend (``seedbed.transport.TRANSPORTS``): arrays of
several dtypes and shapes make the round trip between real actors (processes for shared memory,
threads in-process) and the server, and actions come back as int64 scalars (discrete) or float32
vectors (continuous)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

import seedbed.transport
from seedbed.config import TrainConfig
from seedbed.errors import ConfigError
from seedbed.transport import DEFAULT, TRANSPORTS, backend, check_transport
from seedbed.transport.base import TransportSpec
from tests.conftest import toyplug_registered
from tests.transport.backends import Harness, each_backend

CASES = [((4,), "float32"), ((3, 5, 2), "uint8"), ((6,), "int16"), ((2, 3), "float64")]
STEPS = 25


def expected_obs(actor: int, t: int, envs: int, shape: tuple, dtype: str) -> np.ndarray:
    size = envs * int(np.prod(shape))
    base = (np.arange(size) * 7 + actor * 1000 + t * 13) % 251
    return base.reshape(envs, *shape).astype(dtype)


def expected_actions(env_ids: np.ndarray, t: np.ndarray, action_shape: tuple = ()) -> np.ndarray:
    """Known actions: int64 scalars, or float32 vectors of ``action_shape`` with fractions that
    an integer transport would lose."""
    base = env_ids * 31 + t * 3
    if not action_shape:
        return base.astype(np.int64)
    fractions = (np.arange(int(np.prod(action_shape))) + 1) / 8.0
    vectors = base[:, None] + fractions.reshape(1, -1)
    return vectors.reshape(-1, *action_shape).astype(np.float32)


def scripted_actor(
    endpoint, actor: int, envs: int, shape: tuple, dtype: str, action_shape: tuple = ()
) -> None:
    """Send STEPS known steps; check every answer; exit non-zero on a wrong one."""
    client = endpoint.open()
    env_ids = np.arange(actor * envs, (actor + 1) * envs)
    for t in range(STEPS):
        obs = expected_obs(actor, t, envs, shape, dtype)
        done = np.arange(envs) % 2 == t % 2
        truncated = done & (np.arange(envs) % 3 == 0)
        actions = client.call(obs, np.full(envs, t, np.float32), done, truncated)
        want = expected_actions(env_ids, np.full(envs, t), action_shape)
        if actions.dtype != want.dtype or not np.array_equal(actions, want):
            raise SystemExit(3)
    client.close()


@each_backend
@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_round_trip(name, shape, dtype, no_leaks):
    actors, envs = 3, 4
    b = Harness(name, TransportSpec(actors, envs, shape, dtype))
    try:
        for actor in range(actors):
            b.launch(actor, scripted_actor, envs, shape, dtype)
        served, batch_sizes = 0, []
        while served < actors * envs * STEPS:
            request = b.server.recv(max_envs=actors * envs, timeout_s=0.01)
            if request is None:
                continue
            t = request.reward.astype(np.int64)
            for i, env in enumerate(request.env_ids):
                actor, row = divmod(int(env), envs)
                want = expected_obs(actor, int(t[i]), envs, shape, dtype)[row]
                assert request.obs[i].dtype == np.dtype(dtype)
                np.testing.assert_array_equal(request.obs[i], want)
                assert bool(request.done[i]) == (row % 2 == t[i] % 2)
                assert bool(request.truncated[i]) == (bool(request.done[i]) and row % 3 == 0)
            batch_sizes.append(len(request.env_ids))
            served += len(request.env_ids)
            b.server.send(request, expected_actions(request.env_ids, t))
        assert b.exit_codes() == [0] * actors
        assert max(batch_sizes) > envs, "requests of several actors were never batched"
    finally:
        b.server.close()


@each_backend
@pytest.mark.parametrize("action_shape", [(1,), (3,), (2, 2)])
def test_continuous_actions_round_trip_as_float32(name, action_shape, no_leaks):
    actors, envs, obs_shape = 2, 3, (5,)
    b = Harness(name, TransportSpec(actors, envs, obs_shape, "float32", action_shape, "float32"))
    try:
        for actor in range(actors):
            b.launch(actor, scripted_actor, envs, obs_shape, "float32", action_shape)
        served = 0
        while served < actors * envs * STEPS:
            request = b.server.recv(max_envs=actors * envs, timeout_s=0.01)
            if request is None:
                continue
            t = request.reward.astype(np.int64)
            actions = expected_actions(request.env_ids, t, action_shape)
            assert actions.shape == (len(request.env_ids), *action_shape)
            b.server.send(request, actions)
            served += len(request.env_ids)
        assert b.exit_codes() == [0] * actors  # each actor checked its float32 vectors
    finally:
        b.server.close()


@each_backend
def test_reconnect_gets_new_run_id_and_drops_stale_requests(name, no_leaks):
    b = Harness(name, TransportSpec(1, 2, (3,), "float32"))
    try:
        first = b.server.connect(0)
        client = first.open()
        # A request of the old incarnation is in flight when the actor is replaced.
        threading.Thread(target=lambda: _call_quietly(client), daemon=True).start()
        request = None
        while request is None:
            request = b.server.recv(max_envs=2, timeout_s=0.01)
        old_run = int(request.run_id[0])
        b.launch(0, scripted_actor, 2, (3,), "float32")  # the replacement
        seen = []
        while len(seen) < STEPS:
            request = b.server.recv(max_envs=2, timeout_s=0.01)
            if request is None:
                continue
            assert int(request.run_id[0]) != old_run
            seen.append(request)
            t = request.reward.astype(np.int64)
            b.server.send(request, expected_actions(request.env_ids, t))
        assert b.exit_codes() == [0]
    finally:
        b.server.close()


def _call_quietly(client) -> None:
    with contextlib.suppress(ConnectionError):
        done = np.ones(2, bool)
        client.call(np.zeros((2, 3), np.float32), np.zeros(2, np.float32), done, ~done)


def test_each_registered_backend_builds_both_ends_and_a_board(no_leaks):
    """A backend is its module's ``BACKEND``: the registry line is all the rest needs."""
    for name in TRANSPORTS:
        made = backend(name)
        assert made.about and isinstance(made.actor_processes, bool)
        board = made.make_board(16)
        board.post(b"policy", 3)
        reader = board.handle.open()
        assert reader.read(2) == (b"policy", 3) and reader.read(3) is None
        reader.close()
        board.close()
    assert backend(DEFAULT).actor_processes  # the default serves seedbed train's actors
    assert next(iter(TRANSPORTS)) == DEFAULT == TrainConfig.transport


def test_an_unknown_or_unfit_transport_is_one_line():
    with pytest.raises(ConfigError, match="--transport pigeon: unknown; choose one of shm"):
        check_transport("pigeon")
    with pytest.raises(ConfigError, match="only threads .* use --transport shm"):
        check_transport("inprocess", actor_processes=True)
    check_transport("inprocess")  # fine where actors are threads: the test suite's


def test_a_plugins_transport_is_registered_and_bad_ones_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="a transport named 'shm' is registered already"):
        seedbed.transport.register("shm", "my_rl.rdma")
    with pytest.raises(ConfigError, match="transport 'rdma': cannot import no_such_mod"):
        seedbed.transport.register("rdma", "no_such_mod")
    with pytest.raises(ConfigError, match="seedbed.errors defines no BACKEND"):
        seedbed.transport.register("rdma", "seedbed.errors")
    with pytest.raises(ConfigError, match="one of seedbed's own"):
        seedbed.transport.unregister("shm")
    assert "rdma" not in seedbed.transport.TRANSPORTS
    with toyplug_registered():
        assert seedbed.transport.backend("toyshm").about.startswith("toyshm:")
        seedbed.transport.register("toyshm", "seedbed_toyplug.transport")  # the same: nothing
