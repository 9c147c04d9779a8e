"""In-process transport: actors as threads of the learner process (tests and debugging).

It implements the same interface as the shared-memory transport, so the inference server and the
transport test suite run unchanged against it.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from seedbed.transport.base import CallClock, Request


class InProcessServer:
    """The learner's end; ``connect(actor)`` gives each actor thread its client."""

    def __init__(self, num_actors: int, envs_per_actor: int) -> None:
        self._envs = envs_per_actor
        self._requests: queue.Queue = queue.Queue()
        self._replies = [queue.Queue() for _ in range(num_actors)]
        self._generation = [0] * num_actors
        self._times = np.zeros((num_actors, 2))
        self._lock = threading.Lock()

    def connect(self, actor: int) -> InProcessClient:
        with self._lock:
            self._generation[actor] += 1
            self._replies[actor] = queue.Queue()
            return InProcessClient(self, actor, self._generation[actor])

    def recv(self, max_envs: int, timeout_s: float) -> Request | None:
        try:
            items = [self._requests.get(timeout=0.1)]
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
        return Request(
            env_ids=np.concatenate([np.arange(a * e, (a + 1) * e) for a, *_ in items]),
            obs=np.concatenate([it[2] for it in items]),
            reward=np.concatenate([it[3] for it in items]),
            done=np.concatenate([it[4] for it in items]),
            truncated=np.concatenate([it[5] for it in items]),
            run_id=np.repeat([g for _, g, *_ in items], e).astype(np.int64),
            route=[(a, g) for a, g, *_ in items],
        )

    def send(self, request: Request, actions: np.ndarray) -> None:
        for i, (actor, generation) in enumerate(request.route):
            if generation == self._generation[actor]:
                self._replies[actor].put(actions[i * self._envs : (i + 1) * self._envs].copy())

    def actor_times(self) -> np.ndarray:
        return self._times.copy()

    def close(self) -> None:
        for replies in self._replies:
            replies.put(None)


class InProcessClient:
    """An actor thread's end."""

    def __init__(self, server: InProcessServer, actor: int, generation: int) -> None:
        self._server, self._actor, self._generation = server, actor, generation
        self._replies = server._replies[actor]
        self._clock = CallClock(server._times[actor])

    def open(self) -> InProcessClient:
        return self

    def call(
        self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray
    ) -> np.ndarray:
        self._clock.enter()
        self._server._requests.put(
            (
                self._actor,
                self._generation,
                np.array(obs),
                np.array(reward, np.float32),
                np.array(done, np.bool_),
                np.array(truncated, np.bool_),
            )
        )
        actions = self._replies.get()
        if actions is None:
            raise ConnectionError("the learner went away")
        self._clock.leave()
        return actions

    def close(self) -> None:
        pass
