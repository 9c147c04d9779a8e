"""The transport interface: how observations reach central inference and actions go back.

The server side's loop, as the inference server runs it::

    while running:
        request = server.recv(max_envs, timeout_s)   # envs of one or more actors, or None
        if request is not None:
            actions = ...decide from request.obs...
            server.send(request, actions)             # each actor gets its own rows back

The actor side's loop::

    actions = client.call(obs, reward, done, truncated)   # blocks until the learner answered

A transport moves arrays and nothing else: it knows no torch model and no algorithm. Arrays travel
with their declared dtype and shape; nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import numpy as np


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


class ServerTransport(Protocol):
    """The learner's end: receive batched requests, send actions back."""

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

    def close(self) -> None: ...


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


class ActorTransport(Protocol):
    """An actor's end: one blocking call per step of its environments."""

    def call(
        self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray
    ) -> np.ndarray:
        """Send this step of the actor's E environments; return their E actions
        (``[E, *action_shape]``).

        Raises ConnectionError when the learner has gone away.
        """
        ...

    def close(self) -> None: ...
