"""The transport interface: how actors' steps reach the learner and its answers go back.

A transport moves arrays and nothing else: it knows no torch model and no algorithm. Arrays travel
with their declared dtype and shape; nothing is unpickled. A backend is one module that builds
the two ends below (and a policy board, ``seedbed.transport.board``), named in the registry,
``seedbed.transport.TRANSPORTS``.

The learner's side, as the runtime and the inference server use it::

    server = backend.make_server(spec, context)   # rows for spec.num_actors actor slots
    endpoint = server.connect(slot)               # per actor (re)start: a new run id
    ...start the actor with endpoint; endpoint.close_parent_copy()
    while running:
        request = server.recv(max_envs, timeout_s)   # envs of one or more actors, or None
        if request is not None:
            server.send(request, actions)             # each actor gets its own rows back
    times = server.actor_times()
    server.close()                                    # blocked actors see ConnectionError

An actor's side, in central inference::

    client = endpoint.open()
    while True:
        actions = client.call(obs, reward, done, truncated)   # submit, then collect
        obs, reward, done, truncated = ...step the envs with actions...

With local inference the actor acts itself and sends what it acted; the answer to step t only
says the learner has recorded it, so the actor acts and steps meanwhile::

    while True:
        acted = policy.act(obs, reward, done)
        if t > 0:
            client.collect()                          # step t-1 was recorded
        client.submit(obs, reward, done, truncated, acted)
        obs, reward, done, truncated = ...step the envs with acted["action"]...
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from seedbed.transport.board import PolicyBoard

# Local inference: the fields actors fill in themselves, (name, shape per env, numpy dtype).
Fields = tuple[tuple[str, tuple[int, ...], str], ...]


@dataclasses.dataclass
class Request:
    """A batch of environment steps from one or more actors, as the server received them.

    Row i is environment ``env_ids[i]``. ``done[i]`` says ``obs[i]`` starts a new episode (the
    reward is then the ended episode's last); ``truncated[i]`` says that episode was cut by a time
    limit rather than ended by the task, so the learner may still bootstrap it. ``run_id[i]``
    changes when the actor owning the env restarted, so the server can drop that env's recurrent
    state and partial unroll.

    ``acted`` is set when the actors chose the actions themselves (local inference): their
    actions, the policy version they acted with, the agent's extras (e.g. logits) and the
    recurrent state they acted from, each [k, ...] by name; the server then only records.
    """

    env_ids: np.ndarray  # [k] int64
    obs: np.ndarray  # [k, *obs_shape], the env's dtype
    reward: np.ndarray  # [k] float32
    done: np.ndarray  # [k] bool
    truncated: np.ndarray  # [k] bool, only where done
    run_id: np.ndarray  # [k] int64
    route: Any = None  # the transport's own note of where the answers go
    acted: dict[str, np.ndarray] | None = None  # local inference: what the actors did


@dataclasses.dataclass(frozen=True)
class TransportSpec:
    """What a server carries: its actor slots and one environment's arrays (plain data)."""

    num_actors: int  # actor slots; slot a owns envs [a*E, (a+1)*E)
    envs_per_actor: int  # E
    obs_shape: tuple[int, ...]
    obs_dtype: str
    action_shape: tuple[int, ...] = ()  # one env's action: () for discrete, (A,) for a Box
    action_dtype: str = "int64"
    acted: Fields = ()  # local inference: what actors send besides their step


class ActorTransport(Protocol):
    """An actor's end: one step of its E environments at a time (see the module's loops).

    ``submit`` then ``collect``, strictly alternating; ``call`` is both. Both raise
    ConnectionError once the learner has gone away. Backends subclass this to inherit ``call``.
    """

    def submit(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        acted: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Send this step of the actor's E environments.

        Args:
            obs: ``[E, *obs_shape]`` in the env's dtype.
            reward: ``[E]``: the reward of the step that led to ``obs``.
            done: ``[E]``: ``obs`` starts a new episode.
            truncated: ``[E]``: where done, the ended episode was cut by a time limit.
            acted: With local inference, the fields ``TransportSpec.acted`` names, ``[E, ...]``.
        """
        ...

    def collect(self) -> np.ndarray:
        """Wait for the answer to the last ``submit``: ``[E, *action_shape]`` actions (with local
        inference, only a sign that the step was recorded)."""
        ...

    def close(self) -> None:
        """Let go of the transport (the learner's end stays up)."""
        ...

    def call(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        acted: dict[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """``submit`` then ``collect``: one blocking round trip."""
        self.submit(obs, reward, done, truncated, acted)
        return self.collect()


class Endpoint(Protocol):
    """What one actor needs to reach the server; picklable where actors are processes."""

    actor: int  # the slot

    def open(self) -> ActorTransport:
        """The actor's client, made where the actor runs."""
        ...

    def close_parent_copy(self) -> None:
        """Drop what the starting process still holds once the actor holds its own copy."""
        ...


class ServerTransport(Protocol):
    """The learner's end: receive batched requests, send actions back (see the module's loop)."""

    def connect(self, actor: int, in_process: bool = False) -> Endpoint:
        """A fresh endpoint for (re)starting actor slot ``actor``; its old requests are dropped
        and its next ones carry a new run id. ``in_process``: the endpoint is opened in this
        process (a remote actor's stream handler) rather than handed to a child."""
        ...

    def recv(self, max_envs: int, timeout_s: float) -> Request | None:
        """Wait briefly for a first request, then up to ``timeout_s`` for more, up to
        ``max_envs`` environments. None when nothing arrived (the caller checks for shutdown)."""
        ...

    def send(self, request: Request, actions: np.ndarray) -> None:
        """Answer ``request``: ``actions[i]`` goes to environment ``request.env_ids[i]``.

        ``actions`` is ``[k, *action_shape]`` in the envs' action dtype: int64 ``[k]`` for
        discrete actions, float32 ``[k, A]`` for continuous ones.
        """
        ...

    def actor_times(self) -> np.ndarray:
        """[num_actors, 2]: seconds each actor slot has spent on its own work between calls
        (stepping its envs) and waiting inside calls (transport, batching and inference)."""
        ...

    def close(self) -> None:
        """Shut the transport; actors waiting on it get ConnectionError."""
        ...


@dataclasses.dataclass(frozen=True)
class Backend:
    """A transport as the registry knows it: each backend module defines one as ``BACKEND``."""

    make_server: Callable[[TransportSpec, Any], ServerTransport]  # (spec, multiprocessing ctx)
    make_board: Callable[[int], PolicyBoard]  # the largest payload, in bytes
    # Whether its endpoints reach actors in spawned processes (seedbed train's actors), or only
    # threads of the learner's own process.
    actor_processes: bool
    about: str  # one line, for --help and errors


class CallClock:
    """Splits an actor's time into its own work and waiting for answers, into ``row`` (2,).

    Clients call ``enter`` and ``leave`` around each call; the learner reads the rows to show
    where time goes (``bench/throughput.py --profile``). The actor adds to its row, so a
    restarted actor's slot keeps counting.
    """

    def __init__(self, row: np.ndarray) -> None:
        self._row = row
        self._left: float | None = None
        self._entered = 0.0

    def enter(self) -> None:
        self._entered = time.perf_counter()
        if self._left is not None:
            self._row[0] += self._entered - self._left

    def leave(self) -> None:
        self._left = time.perf_counter()
        self._row[1] += self._left - self._entered
