"""Gateway processes: remote actors' steps decoded beside the learner, not inside it.

With ``--gateways K`` (K > 1) the learner starts K processes, each an ``ActorGateway`` on the
same ``HOST:PORT`` (SO_REUSEPORT: the kernel deals new connections among them). A process
checks each stream (token, hello, caps, sizes and values, as the in-process gateway does),
then writes its steps straight into the learner's shared-memory rows and posts the same pipe
records a local actor posts, and reads the answers from the same rows after the same reply
byte. The learner's interpreter sees only those records: it never decodes a protobuf.

The learner keeps the slots. A process asks for one over its control pipe once an actor has
said hello; the learner's ``gateway-watcher`` thread takes a free one, calls the transport's
``connect`` (a new run id) and answers with the ``Assignment``, the generation and the slot's
reply pipe (passed as a file descriptor). Slots are thus split among the processes as their
actors come, not fixed per process, so a process the kernel gives more connections than
another refuses no actor while slots are free. The same pipe carries the processes' log
records to the learner's log.

On a replicated learner's front door (``serve_as_front_door``) the learner places the actors
too: it holds the ``Placement`` and the count of slots taken over all its processes, so its
answer to a request may be another replica's address instead of a slot, and the process sends
the actor the same ``Redirect`` the in-process front door sends.

The learner's side::

    gateways = GatewayProcesses(k, address, slots, transport, assign, token, tls, board)
    gateways.start()    # serving
    gateways.stop()     # every actor is told that training is over; the processes exit

A process that dies stops the run (``on_failure``, one line naming it): its actors' streams are
gone, and a restart would hide the fault. A process whose learner is gone (its control pipe
closed) stops at once, so none outlives the learner. Caps (connections, streams awaiting a
hello, connections per address) hold per process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import grpc
import numpy as np

from seedbed.errors import SeedbedError
from seedbed.transport.board import BoardHandle
from seedbed.transport.remote.gateway import (
    _COURTESIES,
    _REASONS_KEPT,
    HELLO_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    ActorGateway,
    _Redirected,
    _Rejected,
    slots_taken,
)
from seedbed.transport.remote.placement import Placement
from seedbed.transport.remote.wire import Assignment
from seedbed.transport.shm import ActorEndpoint, Layout, SharedMemoryClient, attach

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0  # a process's import and bind; a busy machine may take long
_ANSWER_TIMEOUT_S = 30.0  # the learner answers a request for a slot within this
_STOP_WAIT_S = 10.0  # past the grace: a process that has not exited by then is killed
# Per process, in shared memory: connections served, streams refused, actors disconnected.
_CONNECTIONS, _REFUSED, _DISCONNECTED = range(3)
PROCESS_NAME = "seedbed-gw"  # a gateway process's name in ps and /proc/PID/comm, and its index
_REASONS_EVERY_S = 10.0  # a process sends at most _REASONS_KEPT refusal reasons in this time


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What one gateway process is started with (pickled once, at its spawn)."""

    index: int
    address: str
    slots: int  # the learner's remote slots, for this process's caps
    probe: Assignment  # any slot's: it sizes the messages
    token: bytes
    tls: tuple[bytes, bytes] | None
    board: BoardHandle | None
    layout: Layout
    requests: Connection  # the write end of the pipe every actor posts records on
    counts: Any  # a shared int64 array, 3 per process
    hello_timeout_s: float
    idle_timeout_s: float
    max_connections: int | None
    log_level: int
    wire: str


class GatewayProcesses:
    """``count`` gateway processes serving remote actors on ``address`` into ``transport``'s
    slots ``slots``; the attributes the run reads (``address``, ``connections``,
    ``rejected_total``, ``rejected``, ``disconnected``) match ``ActorGateway``'s.

    ``transport`` must be the shared-memory server (``seedbed.transport.shm``): the processes
    write its rows. ``assign(slot, connection)`` says what the actor in a slot runs;
    ``on_failure(error)`` is called from the watcher thread when a process dies, or fails,
    before ``stop``.
    """

    def __init__(
        self,
        count: int,
        address: str,
        slots: list[int],
        transport: Any,
        assign: Callable[[int, int], Assignment],
        token: bytes,
        tls: tuple[bytes, bytes] | None = None,
        board: BoardHandle | None = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        wire: str = "grpc",
    ) -> None:
        if not token or not token.strip():
            raise ValueError("GatewayProcesses needs a token: give one, e.g. wire.run_token's")
        if address.startswith("unix:"):
            raise SeedbedError(
                f"--listen {address}: gateway processes share a TCP port; a Unix socket "
                "cannot be shared: use HOST:PORT, or --gateways 1"
            )
        self.wire = wire
        if not slots:
            raise ValueError("GatewayProcesses needs at least one slot")
        _check_port_free(address)
        self._transport, self._assign, self._on_failure = transport, assign, on_failure
        self._free = collections.deque(slots)
        self._held: dict[int, int] = {}  # slot -> the process that holds it
        self.placement: Placement | None = None  # the front door's (serve_as_front_door)
        self.connections = 0  # slots handed out, over all processes
        self.rejected: collections.deque[str] = collections.deque(maxlen=_REASONS_KEPT)
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._synced = threading.Condition()
        self._pongs: dict[int, int] = {}
        self._serving = 0  # processes that said they serve
        ctx = multiprocessing.get_context("spawn")  # imports grpc, not torch; forks nothing
        self._counts_raw = ctx.RawArray("q", 3 * count)
        self._counts = np.frombuffer(self._counts_raw, np.int64).reshape(count, 3)
        self._procs: list[Any] = []
        self._controls: list[Connection] = []
        self._send_locks = [threading.Lock() for _ in range(count)]
        level = min(logging.INFO, logging.getLogger("seedbed").getEffectiveLevel())
        setups = [
            _Setup(
                i,
                address,
                len(slots),
                assign(slots[0], 0),
                token.strip(),
                tls,
                board,
                transport.layout,
                transport.requests_writer,
                self._counts_raw,
                hello_timeout_s,
                idle_timeout_s,
                max_connections,
                level,
                wire,
            )
            for i in range(count)
        ]
        self._watcher = threading.Thread(target=self._watch, name="gateway-watcher", daemon=True)
        try:
            # The first binds (port 0: any free one); the others bind the port it got.
            self.address = self._spawn(ctx, setups[0])
            for setup in setups[1:]:
                self._spawn(ctx, dataclasses.replace(setup, address=self.address))
        except BaseException:
            self._kill()
            for control in self._controls:
                control.close()
            raise
        self.max_per_peer = len(slots) + _COURTESIES  # per process, as ActorGateway's
        self._watcher.start()

    def _spawn(self, ctx: Any, setup: _Setup) -> str:
        """Start one process; wait until it listens, and return where."""
        here, there = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=serve, args=(setup, there), name=f"seedbed-gateway-{setup.index}", daemon=True
        )
        proc.start()
        there.close()
        self._procs.append(proc)
        self._controls.append(here)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            ready = wait([here, proc.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if here in ready:
                try:
                    kind, detail = here.recv()
                except (EOFError, OSError):
                    kind, detail = "failed", f"exited with code {proc.exitcode}"
                if kind == "listening":
                    return detail
                raise SeedbedError(detail if kind == "failed" else f"gateway said {kind}")
            if proc.sentinel in ready or not ready:
                proc.join(1.0)
                why = f"exited with code {proc.exitcode}" if ready else "did not start in time"
                raise SeedbedError(f"gateway process {setup.index} {why}")

    def serve_as_front_door(self, placement: Placement) -> None:
        """Place every new actor with ``placement`` (before ``start``): these processes are
        replica 0's gateway, and the learner answers some of their requests with a redirect."""
        self.placement = placement
        # One machine's actors all pass this door on their way to any replica.
        self.max_per_peer = sum(placement.slots) + _COURTESIES
        for i in range(self.count):  # before "start" on the same pipe: no actor comes first
            self._send(i, ("front-door", self.max_per_peer))

    @property
    def connected(self) -> int:
        """Actors holding a slot now, over all processes (a dict's length is atomic)."""
        return len(self._held)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def served(self) -> list[int]:
        """Connections each process has served."""
        return self._counts[:, _CONNECTIONS].tolist()

    @property
    def rejected_total(self) -> int:
        return int(self._counts[:, _REFUSED].sum())

    @property
    def disconnected(self) -> int:
        return int(self._counts[:, _DISCONNECTED].sum())

    def start(self) -> None:
        """Start serving; return once every process listens."""
        for i in range(len(self._procs)):
            self._send(i, ("start",))
        deadline = time.monotonic() + _START_TIMEOUT_S
        with self._synced:
            while self._serving < self.count and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SeedbedError(
                        f"gateway processes did not start serving in {_START_TIMEOUT_S:g} s"
                    )
                self._synced.wait(min(left, 0.1))
        log.info("listening for actors on %s in %d gateway processes", self.address, self.count)

    @property
    def count(self) -> int:
        return len(self._procs)

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until every live process's messages sent so far are handled (its log lines,
        its refusals): each answers a ping after them."""
        with self._synced:
            want = {i: self._pongs.get(i, 0) + 1 for i in range(self.count)}
        for i, n in want.items():
            with contextlib.suppress(OSError):
                self._send(i, ("ping", n))
        deadline = time.monotonic() + timeout_s
        with self._synced:
            while any(
                self._pongs.get(i, 0) < n and self._procs[i].is_alive() for i, n in want.items()
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._synced.wait(min(left, 0.1))

    def stop(self, grace_s: float = 2.0) -> None:
        """End every stream (its actor is told that training is over) and the processes."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        for i in range(self.count):
            with contextlib.suppress(OSError, ValueError):
                self._send(i, ("stop", grace_s))
        deadline = time.monotonic() + grace_s + _STOP_WAIT_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()
        self._watcher.join(timeout=_STOP_WAIT_S)
        for control in self._controls:
            control.close()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)

    def _send(self, i: int, message: tuple) -> None:
        with self._send_locks[i]:
            self._controls[i].send(message)

    # --- the watcher thread ------------------------------------------------------------------

    def _watch(self) -> None:
        """Answer the processes' requests, take their log lines, notice one that dies."""
        live = {c: i for i, c in enumerate(self._controls)}
        sentinels = {p.sentinel: i for i, p in enumerate(self._procs)}
        while live or sentinels:
            for ready in wait([*live, *sentinels], timeout=1.0):
                if ready in sentinels:
                    i = sentinels.pop(ready)
                    self._ended(i)
                    continue
                i = live[ready]
                try:
                    message = ready.recv()
                except (EOFError, OSError):
                    del live[ready]
                    continue
                try:
                    self._handle(i, message)
                except Exception as error:  # one line for the run, not a silent thread's end
                    self._fail(SeedbedError(f"gateway process {i}: {error}"))
            if self._stopping.is_set() and not any(p.is_alive() for p in self._procs):
                return

    def _handle(self, i: int, message: tuple) -> None:
        kind = message[0]
        if kind == "slot":
            self._grant(i, message[1])
        elif kind == "free":
            if self._held.pop(message[1], None) is not None:
                self._free.append(message[1])
        elif kind == "log":
            record = message[1]
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        elif kind == "refused":
            self.rejected.append(message[1])
        elif kind == "serving":
            with self._synced:
                self._serving += 1
                self._synced.notify_all()
        elif kind == "pong":
            with self._synced:
                self._pongs[i] = message[1]
                self._synced.notify_all()
        elif kind == "failed":
            self._fail(SeedbedError(f"gateway process {i} failed: {message[1]}"))

    def _grant(self, i: int, ticket: int) -> None:
        """A free slot for process ``i``'s actor: its assignment and reply pipe, a refusal, or
        at the front door another replica's address."""
        if self._stopping.is_set():
            self._send(i, ("refused", ticket, "UNAVAILABLE", "training is over"))
            return
        if self.placement is not None:
            address = self.placement.place(len(self._held))
            if address is not None:
                self._send(i, ("redirect", ticket, address))
                return
        if not self._free:
            reason = slots_taken(len(self._held))
            self._send(i, ("refused", ticket, "RESOURCE_EXHAUSTED", reason))
            return
        slot = self._free.popleft()
        try:
            endpoint = self._transport.connect(slot)  # a new generation: a new run id
        except (OSError, ValueError):  # the transport closed: the run is ending
            self._free.append(slot)
            self._send(i, ("refused", ticket, "UNAVAILABLE", "training is over"))
            return
        self.connections += 1
        self._held[slot] = i
        try:
            assignment = self._assign(slot, self.connections)
            with self._send_locks[i]:
                self._controls[i].send(("slot", ticket, assignment, endpoint.generation))
                send_handle(self._controls[i], endpoint.replies.fileno(), self._procs[i].pid)
        finally:
            endpoint.close_parent_copy()

    def _ended(self, i: int) -> None:
        """Process ``i`` exited: its slots are free; before ``stop``, the run must end."""
        for slot in [s for s, holder in self._held.items() if holder == i]:
            del self._held[slot]
            self._free.append(slot)
        if not self._stopping.is_set():
            proc = self._procs[i]
            proc.join(1.0)  # its exit code
            self._fail(
                SeedbedError(
                    f"gateway process {i} (pid {proc.pid}) exited with code {proc.exitcode}; "
                    "its remote actors lost their streams"
                )
            )

    def _fail(self, error: BaseException) -> None:
        """The run's error, once; none while stopping (processes then end on purpose)."""
        if self.error is None and not self._stopping.is_set():
            self.error = error
            log.error("%s", error)
            if self._on_failure is not None:
                self._on_failure(error)


def _check_port_free(address: str) -> None:
    """Refuse a port that something listens on already: SO_REUSEPORT would let the processes
    bind it beside another learner of this user, and actors would land in either run."""
    host, port = address.rsplit(":", 1)
    if int(port) == 0:
        return  # the first process picks a free one
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except OSError:
        return  # the process's own bind says why
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(where)
        except OSError as error:
            raise SeedbedError(
                f"--listen {address}: cannot listen there ({error.strerror})"
            ) from None


# --- a gateway process ------------------------------------------------------------------------


class _ControlLog(logging.Handler):
    """Sends the process's log records to the learner, which logs them as its own."""

    def __init__(self, send: Callable[[tuple], None]) -> None:
        super().__init__()
        self._send_message = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.msg, record.args = record.getMessage(), None
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            self._send_message(("log", record))
        except OSError:
            pass  # the learner is gone: this process is stopping, with no one to tell
        except Exception:  # a log line must never end a stream
            self.handleError(record)


class _SharedCount:
    """An ``ActorGateway`` counter kept in the process's shared ``_counts``, where the learner
    reads it."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __get__(self, gateway: Any, owner: type | None = None) -> Any:
        return self if gateway is None else int(gateway._counts[self.index])

    def __set__(self, gateway: Any, n: int) -> None:
        gateway._counts[self.index] = n


class ProcessGateway(ActorGateway):
    """An ``ActorGateway`` in a gateway process: slots come from the learner over ``control``,
    and its clients write the learner's rows through one shared attachment."""

    def __init__(self, setup: _Setup, control: Connection, send: Callable[[tuple], None]) -> None:
        self._counts = np.frombuffer(setup.counts, np.int64).reshape(-1, 3)[setup.index]
        self._control, self._send_message = control, send
        self._blocks, self._arrays = attach(setup.layout)
        self._layout, self._requests = setup.layout, setup.requests
        self._tickets = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._reasons_sent, self._reasons_since = 0, time.monotonic()
        self.learner_gone = threading.Event()  # set by "stop" or the learner's end
        self.grace_s = 2.0
        self.started = threading.Event()
        probe = setup.probe
        super().__init__(
            setup.address,
            list(range(setup.slots)),
            connect=None,
            assign=lambda slot, n: probe,  # sizes the messages; the learner assigns the rest
            token=setup.token,
            tls=setup.tls,
            board=setup.board,
            hello_timeout_s=setup.hello_timeout_s,
            idle_timeout_s=setup.idle_timeout_s,
            max_connections=setup.max_connections,
            on_failure=lambda error: self._send_message(("failed", repr(error))),
            share_port=True,
            wire=setup.wire,
        )
        self._on_loop(self._watch_control())

    # The counters the learner reads live in shared memory.
    connections = _SharedCount(_CONNECTIONS)
    rejected_total = _SharedCount(_REFUSED)
    disconnected = _SharedCount(_DISCONNECTED)

    async def _watch_control(self) -> None:
        self._loop.add_reader(self._control.fileno(), self._on_control)

    def _on_control(self) -> None:
        """A message from the learner (on the loop)."""
        try:
            message = self._control.recv()
            kind = message[0]
            if kind == "slot":
                _, ticket, assignment, generation = message
                fd = recv_handle(self._control)
                self._granted(ticket, (assignment, generation, fd))
            elif kind == "refused":
                _, ticket, code, reason = message
                self._granted(ticket, _Rejected(grpc.StatusCode[code], reason))
            elif kind == "redirect":
                _, ticket, address = message
                self._granted(ticket, _Redirected(address))
            elif kind == "front-door":
                self.max_per_peer = message[1]
            elif kind == "start":
                self._loop.create_task(self._serve_from_now())
            elif kind == "ping":
                self._send_message(("pong", message[1]))
            elif kind == "stop":
                self.grace_s = message[1]
                self._learner_left()
        except (EOFError, OSError):  # the learner is gone: stop serving
            self._learner_left()

    async def _serve_from_now(self) -> None:
        await self._start_serving()
        self._send_message(("serving",))  # the learner's start returns once all are

    def _learner_left(self) -> None:
        self._stopping.set()
        self._loop.remove_reader(self._control.fileno())
        self.learner_gone.set()

    def _granted(self, ticket: int, answer: Any) -> None:
        future = self._waiting.pop(ticket, None)
        if future is not None and not future.done():
            future.set_result(answer)
        elif not isinstance(answer, (_Rejected, _Redirected)):  # the stream ended: give it back
            os.close(answer[2])
            self._send_message(("free", answer[0].slot))

    async def _take_slot(self) -> tuple[Assignment, Any]:
        if self._stopping.is_set():
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, "training is over")
        ticket = next(self._tickets)
        future = self._waiting[ticket] = self._loop.create_future()
        self._send_message(("slot", ticket))
        try:
            answer = await asyncio.wait_for(asyncio.shield(future), _ANSWER_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, "the learner did not answer") from None
        finally:
            if not future.done():  # a late answer is given back (``_granted``)
                self._waiting[ticket] = future
                future.cancel()
        if isinstance(answer, (_Rejected, _Redirected)):
            raise answer
        assignment, generation, fd = answer
        requests = Connection(os.dup(self._requests.fileno()), readable=False)
        replies = Connection(fd, writable=False)
        endpoint = ActorEndpoint(self._layout, assignment.slot, generation, requests, replies)
        self.connections += 1
        return assignment, SharedMemoryClient(endpoint, self._arrays)

    def _release(self, slot: int) -> None:
        with contextlib.suppress(OSError):
            self._send_message(("free", slot))

    def _refused(self, peer: str, refusal: _Rejected) -> None:
        super()._refused(peer, refusal)
        now = time.monotonic()
        if now - self._reasons_since > _REASONS_EVERY_S:
            self._reasons_sent, self._reasons_since = 0, now
        if self._reasons_sent < _REASONS_KEPT:  # a flood of refusals must not flood the learner
            self._reasons_sent += 1
            with contextlib.suppress(OSError):
                self._send_message(("refused", str(refusal)))

    def close_rows(self) -> None:
        self._arrays.clear()
        for block in self._blocks.values():
            block.close()


def _name_process(name: str) -> None:
    """Show this process as ``name`` in ps, top and /proc/PID/comm (Linux; else nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def serve(setup: _Setup, control: Connection) -> None:
    """A gateway process's body: serve until the learner says stop or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides when this stops
    _name_process(f"{PROCESS_NAME}{setup.index}"[:15])
    lock = threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            control.send(message)

    logger = logging.getLogger("seedbed")
    logger.setLevel(setup.log_level)
    logger.addHandler(_ControlLog(send))
    logger.propagate = False
    try:
        gateway = ProcessGateway(setup, control, send)
    except BaseException as error:
        with contextlib.suppress(OSError):
            send(("failed", str(error) or repr(error)))
        return
    try:
        send(("listening", gateway.address))
        gateway.learner_gone.wait()
        gateway.stop(gateway.grace_s)
    finally:
        gateway.close_rows()
        with contextlib.suppress(OSError):
            control.close()
