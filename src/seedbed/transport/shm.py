"""Shared-memory transport: actors on the learner's host, arrays written once, indices on pipes.

One shared block per field holds every environment's row (observation, reward, done, truncated,
action, and with local inference what the actor acted: see ``Request.acted``); actor ``a`` owns
rows ``[a*E, (a+1)*E)``. An actor writes its rows, then writes an
8-byte record (actor, generation) to a pipe all actors share; the server reads many records with
one syscall, answers by writing actions into the rows and one byte to the actor's own reply pipe.
Pipe writes this small are atomic, so a dying actor cannot corrupt the channel, and the generation
lets the server drop a request sent by an actor that has since been replaced. Its policy board
is ``board.SharedMemoryBoard``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import select
import threading
import time
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from seedbed.transport.base import (
    ActorTransport,
    Backend,
    CallClock,
    Fields,
    Request,
    TransportSpec,
)
from seedbed.transport.board import SharedMemoryBoard

_RECORD = np.dtype([("actor", "<i4"), ("generation", "<i4")])
_FIELDS = ("obs", "reward", "done", "truncated", "action", "actor_times")
_ACTED = "acted:"  # prefix of the local-inference fields' block names
_IDLE_POLL_MS = 100  # how long recv waits for a first request before returning None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the shared arrays live and how they are shaped (sent to actors; plain data)."""

    names: dict[str, str]  # field -> shared-memory block name
    num_actors: int
    envs_per_actor: int
    obs_shape: tuple[int, ...]
    obs_dtype: str
    action_shape: tuple[int, ...] = ()  # one env's action: () for discrete, (A,) for a Box
    action_dtype: str = "int64"
    acted: Fields = ()  # local inference: the fields actors fill in themselves

    def fields(self) -> tuple[str, ...]:
        return (*_FIELDS, *(_ACTED + name for name, _, _ in self.acted))

    def shape_dtype(self, field: str) -> tuple[tuple[int, ...], np.dtype]:
        n = self.num_actors * self.envs_per_actor
        if field.startswith(_ACTED):
            shape, dtype = next((s, d) for name, s, d in self.acted if _ACTED + name == field)
            return (n, *shape), np.dtype(dtype)
        return {
            "obs": ((n, *self.obs_shape), np.dtype(self.obs_dtype)),
            "reward": ((n,), np.dtype(np.float32)),
            "done": ((n,), np.dtype(np.bool_)),
            "truncated": ((n,), np.dtype(np.bool_)),
            "action": ((n, *self.action_shape), np.dtype(self.action_dtype)),
            "actor_times": ((self.num_actors, 2), np.dtype(np.float64)),
        }[field]


def attach(
    layout: Layout, create: bool = False
) -> tuple[dict[str, shared_memory.SharedMemory], dict[str, np.ndarray]]:
    """The blocks of ``layout`` (made, with ``create``) and every field's array over them.

    A process that serves many actors' rows (a gateway process) attaches once and opens its
    clients on these arrays, rather than mapping every block again per actor."""
    blocks, arrays = {}, {}
    for field in layout.fields():
        shape, dtype = layout.shape_dtype(field)
        size = max(1, math.prod(shape) * dtype.itemsize)
        if create:
            block = shared_memory.SharedMemory(create=True, size=size)
        else:
            block = shared_memory.SharedMemory(name=layout.names[field])
        blocks[field] = block
        arrays[field] = np.ndarray(shape, dtype, buffer=block.buf)
    return blocks, arrays


@dataclasses.dataclass
class ActorEndpoint:
    """Everything one actor process needs to reach the server; picklable for spawn."""

    layout: Layout
    actor: int
    generation: int
    requests: Connection  # write end of the pipe all actors share
    replies: Connection  # read end of this actor's own reply pipe

    def open(self) -> SharedMemoryClient:
        """Attach to the server from the actor process."""
        return SharedMemoryClient(self)

    def close_parent_copy(self) -> None:
        """The parent's copy of the reply read end; closed once the child holds its own."""
        self.replies.close()


class SharedMemoryServer:
    """The learner's end of the shared-memory transport.

    Each env's observation is an ``obs_shape`` array of ``obs_dtype`` and its action one of
    ``action_shape`` and ``action_dtype`` (the defaults: one int64, a discrete action).
    """

    def __init__(
        self,
        num_actors: int,
        envs_per_actor: int,
        obs_shape: tuple[int, ...],
        obs_dtype: str,
        context: Any,
        action_shape: tuple[int, ...] = (),
        action_dtype: str = "int64",
        acted: Fields = (),
    ) -> None:
        """``acted``: with local inference, the fields actors send besides their step
        (``Layout.acted``); requests then carry them as ``Request.acted``."""
        self._ctx = context
        self._envs = envs_per_actor
        layout = Layout(
            {},
            num_actors,
            envs_per_actor,
            tuple(obs_shape),
            obs_dtype,
            tuple(action_shape),
            action_dtype,
            acted,
        )
        self._blocks, self._arrays = attach(layout, create=True)
        names = {field: block.name for field, block in self._blocks.items()}
        self.layout = dataclasses.replace(layout, names=names)
        self._requests_r, self._requests_w = context.Pipe(duplex=False)
        self._poller = select.poll()
        self._poller.register(self._requests_r.fileno(), select.POLLIN)
        self._replies: list[Connection | None] = [None] * num_actors
        self._generation = np.zeros(num_actors, np.int64)
        self._pending = b""
        self._lock = threading.Lock()  # guards reply pipes against replacement while sending
        self._closed = False

    @property
    def requests_writer(self) -> Connection:
        """The write end of the pipe every actor posts its records on (a gateway process gets
        it at its start, and dups it per actor it serves)."""
        return self._requests_w

    def connect(self, actor: int, in_process: bool = False) -> ActorEndpoint:
        """A fresh endpoint for (re)starting actor ``actor``; its old requests become stale.

        ``in_process``: the endpoint is opened in this process (a remote actor's stream handler),
        so it gets its own copy of the shared request pipe to close.
        """
        reader, writer = self._ctx.Pipe(duplex=False)
        requests = self._requests_w
        if in_process:
            requests = Connection(os.dup(self._requests_w.fileno()), readable=False)
        with self._lock:
            self._generation[actor] += 1
            old, self._replies[actor] = self._replies[actor], writer
        if old is not None:
            old.close()
        return ActorEndpoint(self.layout, actor, int(self._generation[actor]), requests, reader)

    def _wait(self, timeout_s: float) -> bool:
        return bool(self._poller.poll(max(0.0, timeout_s) * 1000.0))

    def recv(self, max_envs: int, timeout_s: float) -> Request | None:
        """Requests of whole actors, up to ``max_envs`` envs (at least one actor)."""
        fd = self._requests_r.fileno()
        buf = self._pending
        if not buf:
            if not self._wait(_IDLE_POLL_MS / 1000.0):
                return None
            buf = os.read(fd, 65536)
        max_actors = max(1, max_envs // self._envs)
        deadline = time.perf_counter() + timeout_s
        while len(buf) // _RECORD.itemsize < max_actors:
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or not self._wait(remaining):
                break
            buf += os.read(fd, 65536)
        take = max_actors * _RECORD.itemsize
        buf, self._pending = buf[:take], buf[take:]
        records = np.frombuffer(buf, _RECORD)
        current = self._generation[records["actor"]] == records["generation"]
        actors, first = np.unique(records["actor"][current], return_index=True)
        if len(actors) == 0:
            return None
        # The records' own generations are the run ids: a restart racing this recv cannot
        # relabel an old request as the new run's.
        return self._request(actors.astype(np.int64), records["generation"][current][first])

    def _request(self, actors: np.ndarray, generations: np.ndarray) -> Request:
        e = self._envs
        a = self._arrays
        if actors[-1] - actors[0] + 1 == len(actors):  # contiguous rows: views, no copy
            rows: Any = slice(int(actors[0]) * e, (int(actors[-1]) + 1) * e)
            env_ids = np.arange(rows.start, rows.stop, dtype=np.int64)
        else:
            env_ids = (actors[:, None] * e + np.arange(e)).reshape(-1)
            rows = env_ids
        run_id = np.repeat(generations.astype(np.int64), e)
        acted = {name: a[_ACTED + name][rows] for name, _, _ in self.layout.acted}
        return Request(
            env_ids,
            a["obs"][rows],
            a["reward"][rows],
            a["done"][rows],
            a["truncated"][rows],
            run_id,
            route=(actors, generations, rows),
            acted=acted or None,
        )

    def send(self, request: Request, actions: np.ndarray) -> None:
        """Write the actions into the actors' rows and wake each actor."""
        actors, generations, rows = request.route
        self._arrays["action"][rows] = actions
        with self._lock:
            for actor, generation in zip(actors.tolist(), generations.tolist(), strict=True):
                conn = self._replies[actor]
                if conn is None or generation != self._generation[actor]:
                    continue  # replaced meanwhile; the new actor never asked this
                # An actor that died cannot be woken; the supervisor restarts it with a new pipe.
                with contextlib.suppress(OSError):
                    os.write(conn.fileno(), b"\x01")

    def actor_times(self) -> np.ndarray:
        return self._arrays["actor_times"].copy()

    def close(self) -> None:
        """Close pipes and free the shared memory (actors see the learner gone)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for conn in self._replies:
                if conn is not None:
                    conn.close()
        self._requests_r.close()
        self._requests_w.close()
        self._arrays.clear()
        for block in self._blocks.values():
            block.close()
            block.unlink()


class SharedMemoryClient(ActorTransport):
    """An actor's end: write the step into its own rows, signal, wait for the answer."""

    def __init__(
        self, endpoint: ActorEndpoint, arrays: dict[str, np.ndarray] | None = None
    ) -> None:
        """``arrays``: the layout's arrays as ``attach`` gave them to this process, shared with
        other clients (then closing this client leaves them mapped); None: attach its own."""
        self._endpoint = endpoint
        layout = endpoint.layout
        self._blocks = {}
        if arrays is None:
            self._blocks, arrays = attach(layout)
        e = layout.envs_per_actor
        rows = slice(endpoint.actor * e, (endpoint.actor + 1) * e)
        self._obs, self._reward = arrays["obs"][rows], arrays["reward"][rows]
        self._done, self._action = arrays["done"][rows], arrays["action"][rows]
        self._truncated = arrays["truncated"][rows]
        self._acted = {name: arrays[_ACTED + name][rows] for name, _, _ in layout.acted}
        self._waiting = False  # the clock is in a call since submit
        self._clock = CallClock(arrays["actor_times"][endpoint.actor])
        self._record = np.array([(endpoint.actor, endpoint.generation)], _RECORD).tobytes()
        self._req_fd = endpoint.requests.fileno()
        self._reply_fd = endpoint.replies.fileno()

    def submit(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        acted: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Write the step into this actor's rows and ask for its actions (with local inference,
        ``acted`` holds the fields the layout names, and the answer only says the learner has
        recorded the step, so the rows may be written again)."""
        self._obs[...] = obs
        self._reward[...] = reward
        self._done[...] = done
        self._truncated[...] = truncated
        for name, rows in self._acted.items():
            rows[...] = acted[name]
        # A local actor works on between submit and collect: it waits only inside collect.
        self._waiting = acted is None
        if self._waiting:
            self._clock.enter()
        try:
            os.write(self._req_fd, self._record)
        except OSError as e:
            raise ConnectionError(f"the learner's transport closed: {e}") from None

    def collect(self) -> np.ndarray:
        """Wait for the answer to the last ``submit`` (at once, if ``reply_fd`` is readable)."""
        if not self._waiting:
            self._clock.enter()
        try:
            answered = os.read(self._reply_fd, 1)
        except OSError as e:
            raise ConnectionError(f"the learner's transport closed: {e}") from None
        if not answered:
            raise ConnectionError("the learner went away")
        self._clock.leave()
        return self._action.copy()

    @property
    def reply_fd(self) -> int:
        """Readable once the answer to the last ``submit`` is in (for event loops)."""
        return self._reply_fd

    def close(self) -> None:
        self._obs = self._reward = self._done = self._truncated = self._action = None
        self._acted = {}
        self._clock = None
        for block in self._blocks.values():
            block.close()
        self._endpoint.requests.close()
        self._endpoint.replies.close()


def _make_server(spec: TransportSpec, context: Any) -> SharedMemoryServer:
    return SharedMemoryServer(
        spec.num_actors,
        spec.envs_per_actor,
        spec.obs_shape,
        spec.obs_dtype,
        context,
        action_shape=spec.action_shape,
        action_dtype=spec.action_dtype,
        acted=spec.acted,
    )


BACKEND = Backend(
    make_server=_make_server,
    make_board=SharedMemoryBoard,
    actor_processes=True,
    about="shared memory: actor processes on the learner's host (rows in shm, pipes signal)",
)
