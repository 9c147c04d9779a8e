"""In-process transport: actors as threads of the learner's process (tests and debugging).

It keeps the interface's promises with queues instead of shared memory: whole actors per
request, a new run id per ``connect``, stale requests dropped, ``ConnectionError`` once the
server closes, and local inference's ``acted`` fields. So the inference server, local inference
and the transport test suite run unchanged against it. Its endpoints hold queues and cannot
cross to another process, so ``seedbed train``, whose actors are processes, cannot use it.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any

import numpy as np

from seedbed.transport.base import ActorTransport, Backend, CallClock, Request, TransportSpec

_IDLE_POLL_S = 0.1  # how long recv waits for a first request before returning None


class InProcessServer:
    """The learner's end; ``connect(actor)`` gives each actor thread its endpoint."""

    def __init__(self, num_actors: int, envs_per_actor: int) -> None:
        self._envs = envs_per_actor
        self._requests: queue.Queue = queue.Queue()
        self._replies = [queue.Queue() for _ in range(num_actors)]
        self._generation = [0] * num_actors
        self._times = np.zeros((num_actors, 2))
        self._lock = threading.Lock()

    def connect(self, actor: int, in_process: bool = False) -> InProcessEndpoint:
        """A fresh endpoint for actor slot ``actor`` (every endpoint here is in-process)."""
        with self._lock:
            self._generation[actor] += 1
            old, self._replies[actor] = self._replies[actor], queue.Queue()
            old.put(None)  # an old incarnation still waiting is told it was replaced
            return InProcessEndpoint(self, actor, self._generation[actor])

    def recv(self, max_envs: int, timeout_s: float) -> Request | None:
        try:
            items = [self._requests.get(timeout=_IDLE_POLL_S)]
        except queue.Empty:
            return None
        while len(items) * self._envs < max_envs:
            try:
                items.append(self._requests.get(timeout=timeout_s))
            except queue.Empty:
                break
        items = [it for it in items if it[1] == self._generation[it[0]]]
        if not items:
            return None
        items.sort(key=lambda it: it[0])
        e = self._envs
        acted = None
        if items[0][6] is not None:
            acted = {name: np.concatenate([it[6][name] for it in items]) for name in items[0][6]}
        return Request(
            env_ids=np.concatenate([np.arange(a * e, (a + 1) * e) for a, *_ in items]),
            obs=np.concatenate([it[2] for it in items]),
            reward=np.concatenate([it[3] for it in items]),
            done=np.concatenate([it[4] for it in items]),
            truncated=np.concatenate([it[5] for it in items]),
            run_id=np.repeat([g for _, g, *_ in items], e).astype(np.int64),
            route=[(a, g) for a, g, *_ in items],
            acted=acted,
        )

    def send(self, request: Request, actions: np.ndarray) -> None:
        with self._lock:
            for i, (actor, generation) in enumerate(request.route):
                if generation == self._generation[actor]:
                    rows = actions[i * self._envs : (i + 1) * self._envs]
                    self._replies[actor].put(np.array(rows))

    def actor_times(self) -> np.ndarray:
        return self._times.copy()

    def close(self) -> None:
        with self._lock:
            for replies in self._replies:
                replies.put(None)


@dataclasses.dataclass
class InProcessEndpoint:
    """One actor thread's way in; ``open`` it in that thread."""

    server: InProcessServer
    actor: int
    generation: int

    def open(self) -> InProcessClient:
        return InProcessClient(self.server, self.actor, self.generation)

    def close_parent_copy(self) -> None:
        pass  # a thread shares everything with its starter: nothing to hand over


class InProcessClient(ActorTransport):
    """An actor thread's end."""

    def __init__(self, server: InProcessServer, actor: int, generation: int) -> None:
        self._server, self._actor, self._generation = server, actor, generation
        self._replies = server._replies[actor]
        self._clock = CallClock(server._times[actor])
        self._waiting = False  # the clock is in a call since submit

    def submit(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        acted: dict[str, np.ndarray] | None = None,
    ) -> None:
        # A local actor works on between submit and collect: it waits only inside collect.
        self._waiting = acted is None
        if self._waiting:
            self._clock.enter()
        # Copies: the actor may reuse its arrays before the server reads them, as with rows.
        self._server._requests.put(
            (
                self._actor,
                self._generation,
                np.array(obs),
                np.array(reward, np.float32),
                np.array(done, np.bool_),
                np.array(truncated, np.bool_),
                None if acted is None else {k: np.array(v) for k, v in acted.items()},
            )
        )

    def collect(self) -> np.ndarray:
        if not self._waiting:
            self._clock.enter()
        actions = self._replies.get()
        if actions is None:
            raise ConnectionError("the learner went away")
        self._clock.leave()
        return actions

    def close(self) -> None:
        pass


class InProcessBoard:
    """The newest policy behind a lock; readers are views of the same object."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._post: tuple[bytes, int] | None = None
        self._lock = threading.Lock()

    @property
    def handle(self) -> InProcessBoard:
        return self  # open() makes each reader

    def open(self) -> _BoardReader:
        return _BoardReader(self)

    def post(self, payload: bytes, version: int) -> None:
        if len(payload) > self.capacity:
            raise ValueError(f"a {len(payload)}-byte policy exceeds the board's {self.capacity}")
        with self._lock:
            self._post = (bytes(payload), version)

    def read(self, newer_than: int) -> tuple[bytes, int] | None:
        with self._lock:
            post = self._post
        return post if post is not None and post[1] > newer_than else None

    def close(self) -> None:
        with self._lock:
            self._post = None


@dataclasses.dataclass
class _BoardReader:
    """An actor's reader: closing it leaves the learner's board alone."""

    board: InProcessBoard

    def read(self, newer_than: int) -> tuple[bytes, int] | None:
        return self.board.read(newer_than)

    def close(self) -> None:
        pass


def _make_server(spec: TransportSpec, context: Any) -> InProcessServer:
    return InProcessServer(spec.num_actors, spec.envs_per_actor)


BACKEND = Backend(
    make_server=_make_server,
    make_board=InProcessBoard,
    actor_processes=False,
    about="in-process: actors as threads of the learner's process, over queues (tests)",
)
