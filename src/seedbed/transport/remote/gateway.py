"""The learner's gRPC listener: remote actors, one bidirectional stream each, as in SEED RL.

The learner runs an :class:`ActorGateway`. Each remote actor opens one stream, says hello, and is
given a slot: a block of environment rows in the learner's server transport, with a fresh run id
(so the learner drops any state the slot had). The stream's handler then acts as that slot's
local actor: it submits each step it receives into the slot and waits for the answer like any
actor process does. Remote and local actors therefore meet in the very same inference batches,
and the inference server knows nothing of the network.

Messages are checked before use (``wire``): nothing is unpickled. Every listener, loopback and
Unix sockets included, needs a shared token (sent as ``authorization: Bearer TOKEN``
metadata); TLS is optional. Message sizes are capped at what one step of the slot can hold. A
stream without the token is refused within a second, holding nothing an actor needs, and one
that says no hello within ``HELLO_TIMEOUT_S`` is closed: streams that never become actors
cannot lock actors out. Connections are bounded too: at most ``max_connections`` at once
(gRPC closes the next ones as they come, before HTTP/2), each closed once idle (no stream) for
``idle_timeout_s``, and one address may hold streams on at most ``max_per_peer`` of them. An
actor whose steps carry non-finite values ``REFUSED_IN_A_ROW`` times in a row is disconnected
(the inference server refuses each such step anyway).

A replicated learner runs one gateway per replica. Replica 0's is the front door, the address
actors are given: with a ``Placement`` (``serve_as_front_door``) it places each actor, after its
token and hello are checked, on the replica with the fewest actors, serving it itself or
answering its hello with a ``Redirect`` to that replica's gateway, where the actor starts over
with the same checks.

With local inference the actor acts itself: its steps carry what it acted (as actor processes
write it into their rows), and the gateway sends it each newer policy from the learner's policy
board before answering a step.

``gateway_process`` runs this gateway in processes of their own (``--gateways K``); there a
subclass takes each slot from the learner (``_take_slot``, ``_release``), and the rest is this.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import math
import os
import ssl
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np

from seedbed.errors import SeedbedError
from seedbed.transport.base import Endpoint
from seedbed.transport.board import BoardHandle
from seedbed.transport.checks import REFUSED_IN_A_ROW, check_step
from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote.framing import FrameProtocol, TooLarge, token_of
from seedbed.transport.remote.placement import Placement
from seedbed.transport.remote.tasks import end_tasks
from seedbed.transport.remote.wire import (
    PROTOCOL,
    ActionsReply,
    Assignment,
    Malformed,
    StepDecoder,
    parse,
    serialize,
)

log = logging.getLogger(__name__)

_HEADROOM = 64 * 1024  # bytes a message may carry beyond its arrays (field tags, dtype strings)

# What a stream may hold before it has said hello (see ActorGateway._create).
HELLO_TIMEOUT_S = 5.0  # a stream with no hello by then is closed; a real actor sends it at once
MAX_PENDING_HELLOS = 64  # streams awaiting their hello at once; the next ones are refused
_COURTESY_S = 1.0  # how long a stream without the token may wait to be refused (one at most)
_COURTESIES = 16  # such streams waiting at once; the next ones are refused without a wait
_REFUSING = 16  # room in gRPC's own cap for streams that are being refused right now
_LOG_REFUSALS_EVERY_S = 10.0  # one warning per kind of refusal in this time, then a count
_REASONS_KEPT = 100  # the newest refusal reasons kept, for tests and the run's summary
IDLE_TIMEOUT_S = 60.0  # a connection without a stream this long is closed
_NAME_CHARS = 64  # an actor's name as logged: printable, at most this long
_END_TASKS_S = 1.0  # how long what a stopped server left on the loop may take to end


def safe_name(name: str) -> str:
    """An actor's self-given name, fit for one log line: printable ASCII, bounded."""
    shown = "".join(c if " " <= c <= "~" else "?" for c in name[:_NAME_CHARS])
    return shown + ("..." if len(name) > _NAME_CHARS else "")


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the new one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft  # as it was: the cap below then leaves the rest to the learner
    return hard


def connection_cap(slots: int) -> int:
    """How many connections the listener holds at once: room for every slot and every wait
    the gateway allows, and at most half the descriptors this process may open (checkpoints,
    shared memory and logs need the rest)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = slots + MAX_PENDING_HELLOS + _COURTESIES + _REFUSING + 64
    return wanted if soft == resource.RLIM_INFINITY else max(8, min(wanted, soft // 2))


def slots_taken(slots: int) -> str:
    """Why an actor is refused when every remote slot is taken."""
    return (
        f"all {slots} remote actor slots are taken; start the learner with a larger --remote-actors"
    )


def _kind(message: pb.ActorMessage | Malformed | None) -> str | None:
    """The message's kind; a malformed one is refused right here."""
    if isinstance(message, Malformed):
        raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, message.error)
    return None if message is None else message.WhichOneof("kind")


class _Rejected(Exception):
    """A message the gateway refuses; ends that actor's stream with ``code``."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Redirected(Exception):
    """The front door's answer to an actor another replica takes: its gateway's address."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


class ActorGateway:
    """Serves remote actors on ``address`` and bridges each one to a slot of the learner's server.

    ``connect(slot)`` returns a fresh in-process endpoint of the learner's server transport for
    ``slot`` (a new run id), whose client has a ``reply_fd`` that turns readable once the answer
    is in (the shared-memory one has); ``assign(slot, connection)`` what the actor in it
    runs. Slots are handed out first come, first served; an actor arriving when all are taken is
    refused, and a slot is free again the moment its stream ends. Refusals are counted
    (``rejected_total``; the newest reasons in ``rejected``) and logged at most once per kind
    in ``_LOG_REFUSALS_EVERY_S``, so a flood of them neither floods the log nor goes unsaid.

    All streams are served by gRPC's asyncio API on one event loop in its own thread, which
    waits for the shared-memory answers on their reply pipes: many actors cost no thread each
    in this process, where the inference and learner threads need the interpreter too.
    """

    def __init__(
        self,
        address: str,
        slots: list[int],
        connect: Callable[[int], Endpoint],
        assign: Callable[[int, int], Assignment],
        token: bytes,
        tls: tuple[bytes, bytes] | None = None,
        board: BoardHandle | None = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        share_port: bool = False,
        wire: str = "grpc",
    ) -> None:
        """``token``: what actors must send (never empty). ``board``: with local inference, the
        ``BoardHandle`` of the policy actors act with. ``hello_timeout_s``: how long a new
        stream may take to say hello before it is closed; ``idle_timeout_s``: how long a
        connection may hold no stream; ``max_connections``: connections at once (default
        ``connection_cap``). ``on_failure(error)`` is called, from the gateway's thread, if an
        error ends its event loop: no actor is served after that, so the run must stop.
        ``share_port``: bind with SO_REUSEPORT, so that gateway processes of this learner
        share one port (``gateway_process``). ``wire``: ``grpc``, or ``socket``: the same
        messages on a plain socket (``framing``)."""
        if not token or not token.strip():
            raise ValueError("ActorGateway needs a token: give one, e.g. wire.run_token(run_dir)'s")
        self._board = board.open() if board is not None else None
        self._token = token.strip()
        self._idle_timeout_s = idle_timeout_s
        raise_fd_limit()  # connections, checkpoints and shared memory all need descriptors
        self.max_connections = max_connections or connection_cap(len(slots))
        # One address's connections that hold a stream: all of a machine's actors (seedbed
        # launch runs them all on this host), and a few more.
        self.max_per_peer = len(slots) + _COURTESIES
        self._peers: dict[str, dict[str, int]] = {}  # host -> {connection: streams}
        self.disconnected = 0  # actors sent away for non-finite steps
        self._connect = connect
        self._assign = assign
        self._free = list(slots)
        self._num_slots = len(slots)
        self.connections = 0
        self._stopping = threading.Event()
        self._hello_timeout_s = hello_timeout_s
        self._pending = 0  # streams with the token awaiting their hello
        self._courtesies = 0  # streams without it awaiting their refusal
        # Refusals: the newest reasons and how many in all, for tests and the run's summary.
        self.rejected: deque[str] = deque(maxlen=_REASONS_KEPT)
        self.rejected_total = 0
        self._last_warned: dict[grpc.StatusCode, float] = {}
        self._unwarned: dict[grpc.StatusCode, int] = {}  # refusals since that warning
        probe = assign(slots[0], 0) if slots else None
        self._max_bytes = _HEADROOM + (self._step_bytes(probe) if probe else 0)
        self.error: BaseException | None = None  # what ended the event loop, if anything did
        self._replies: dict[int, _ReplyPipe] = {}  # per open client, by id
        self.placement: Placement | None = None  # the front door's (serve_as_front_door)
        self._on_failure = on_failure
        self._share_port = share_port
        if wire not in WIRES:
            raise ValueError(f"wire {wire!r}: one of {', '.join(WIRES)}")
        self.wire = wire
        self._streams: set[FrameProtocol] = set()  # the socket wire's open connections
        self._tasks: set[asyncio.Task] = set()  # and their handlers
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="actor-gateway", daemon=True)
        self._thread.start()
        try:
            port = self._on_loop(self._create(address, tls, len(slots)))
        except BaseException:
            self._close_loop()
            raise
        if port == 0 and not address.startswith("unix:"):
            self._close_loop()
            raise SeedbedError(f"--listen {address}: cannot listen there (in use, or no such host)")
        self.address = address if address.startswith("unix:") else _with_port(address, port)

    def serve_as_front_door(self, placement: Placement) -> None:
        """Place every new actor with ``placement`` (before actors dial it): this gateway is
        replica 0's, the one actors dial, and redirects some of them to the other replicas."""
        self.placement = placement
        # One machine's actors all pass this door on their way to any replica.
        self.max_per_peer = sum(placement.slots) + _COURTESIES

    @property
    def connected(self) -> int:
        """Actors holding a slot now (read from any thread: a list's length is atomic)."""
        return self._num_slots - len(self._free)

    def _run(self) -> None:
        """The gateway's thread: its event loop, until ``stop`` or an error ends it."""
        try:
            self._loop.run_forever()
        except BaseException as error:  # the thread's end, told to the run rather than lost
            self.error = error
            if self._on_failure is not None:
                self._on_failure(error)

    def _on_loop(self, coroutine: Any, timeout_s: float | None = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    async def _create(self, address: str, tls: tuple[bytes, bytes] | None, slots: int) -> int:
        if self.wire == "socket":
            return await self._create_socket_server(address, tls)
        self._server = grpc.aio.server(
            handlers=[
                grpc.method_handlers_generic_handler(
                    "seedbed.v1.Learner",
                    {
                        "Act": grpc.stream_stream_rpc_method_handler(
                            self._serve,
                            request_deserializer=functools.partial(parse, limit=self._max_bytes),
                            response_serializer=serialize,
                        )
                    },
                )
            ],
            options=[
                # gRPC itself drops messages past 4x the limit, before they cost memory; up to
                # there wire.parse refuses them with a reason in the log.
                ("grpc.max_receive_message_length", 4 * self._max_bytes),
                # Off unless this learner's own gateway processes share the port: another
                # program must not be able to bind it beside us.
                ("grpc.so_reuseport", int(self._share_port)),
                # Notice a vanished actor machine within a minute, not at TCP's hours.
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # A connection that has not finished its TLS and HTTP/2 handshakes by then is
                # dropped (gRPC's default is 120 s): slow connections cost sockets too.
                ("grpc.server_handshake_timeout_ms", max(1, round(1000 * self._hello_timeout_s))),
                # Connections that answer pings but never hold a stream are closed, and there
                # are never more than the cap: idle ones cannot use up the descriptors.
                ("grpc.max_connection_idle_ms", max(1, round(1000 * self._idle_timeout_s))),
                ("grpc.max_allowed_incoming_connections", self.max_connections),
            ],
            # Our own limits bound what a stream can hold: a slot (at most `slots` streams),
            # or a wait for its hello (at most MAX_PENDING_HELLOS, hello_timeout_s each), or
            # without the token a wait to be refused (_COURTESIES, _COURTESY_S each); the rest
            # are refused as they come. gRPC's cap, which refuses without a word in our log,
            # is a backstop above all of these, never what turns a real actor away.
            maximum_concurrent_rpcs=slots + MAX_PENDING_HELLOS + _COURTESIES + _REFUSING,
        )
        if tls is not None:
            credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])  # (key, cert)
            return self._server.add_secure_port(address, credentials)
        return self._server.add_insecure_port(address)

    async def _create_socket_server(self, address: str, tls: tuple[bytes, bytes] | None) -> int:
        """The socket wire's listener; its port (0: it could not listen there)."""
        context = _server_tls(tls) if tls is not None else None
        options: dict[str, Any] = {"ssl": context, "start_serving": False}
        if context is not None:
            # A connection that has not finished its TLS handshake by then is dropped.
            options["ssl_handshake_timeout"] = self._hello_timeout_s

        def protocol() -> FrameProtocol:
            return FrameProtocol(self._socket_opened, self._socket_closed)

        try:
            if address.startswith("unix:"):
                self._server = await self._loop.create_unix_server(
                    protocol, address[len("unix:") :], **options
                )
                return 0
            host, port = address.rsplit(":", 1)
            self._server = await self._loop.create_server(
                protocol, host.strip("[]"), int(port), reuse_port=self._share_port, **options
            )
        except OSError as error:
            if address.startswith("unix:"):
                raise SeedbedError(f"--listen {address}: cannot listen there ({error})") from None
            return 0  # the caller says so, as for gRPC
        return self._server.sockets[0].getsockname()[1]

    def _socket_opened(self, stream: FrameProtocol) -> None:
        """A new connection on the socket wire: served, or past the cap closed at once (as
        gRPC's own cap does)."""
        if len(self._streams) >= self.max_connections or self._stopping.is_set():
            stream.abort()
            return
        self._streams.add(stream)
        task = self._loop.create_task(self._serve_socket(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _socket_closed(self, stream: FrameProtocol) -> None:
        self._streams.discard(stream)

    async def _serve_socket(self, stream: FrameProtocol) -> None:
        """One connection of the socket wire: its preamble (the token), then ``_serve``."""
        context = _SocketContext(stream)
        try:
            try:
                first = await stream.read(self._hello_timeout_s)
            except asyncio.TimeoutError:
                raise _Rejected(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no token within {self._hello_timeout_s:g} s",
                ) from None
            except TooLarge:
                first = b""
            context.token = token_of(first)
            if context.token is None:
                raise _Rejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "not a seedbed actor on the socket wire: start the actor with --wire socket",
                )
            stream.set_limit(self._max_bytes)
            async for reply in self._serve(_messages(stream, self._max_bytes), context):
                stream.write(serialize(reply))
        except _Rejected as refusal:
            self._refused(context.peer(), refusal)
            context.stop(refusal.code, str(refusal))
        except (_Aborted, ConnectionError):
            pass  # refused inside _serve (counted there), or the actor is gone
        finally:
            stream.close()

    async def _stop_socket_server(self, grace_s: float) -> None:
        """Take no new connections; give the streams ``grace_s`` to end (an actor's next step
        finds the learner's transport closed and is told training is over), then tell the
        rest so and close them."""
        self._server.close()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for stream in list(self._streams):
            _SocketContext(stream).stop(grpc.StatusCode.OK, "training is over")
            stream.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)

    @staticmethod
    def _step_bytes(assignment: Assignment) -> int:
        obs = math.prod(assignment.obs_shape) * np.dtype(assignment.obs_dtype).itemsize
        acted = sum(math.prod(s) * np.dtype(d).itemsize for _, s, d in assignment.acted())
        return assignment.num_envs * (obs + 4 + 1 + 1 + acted)

    def start(self) -> None:
        self._on_loop(self._start_serving())
        log.info("listening for actors on %s", self.address)

    async def _start_serving(self) -> None:
        if self.wire == "grpc":
            await self._server.start()
        else:
            await self._server.start_serving()

    def stop(self, grace_s: float = 2.0) -> None:
        """Refuse new actors and end every stream (their actors are told training is over)."""
        if self._loop.is_closed():
            return
        self._stopping.set()
        if self._thread.is_alive():  # a loop an error ended runs nothing more
            stopping = (
                self._server.stop(grace_s)
                if self.wire == "grpc"
                else self._stop_socket_server(grace_s)
            )
            self._on_loop(stopping, timeout_s=grace_s + 10.0)
        self._close_loop()
        for code, count in self._unwarned.items():
            log.warning(
                "refused %d more streams with %s since the last such warning", count, code.name
            )
        if self._board is not None:
            self._board.close()

    def _close_loop(self) -> None:
        if self._thread.is_alive():  # what the server's stop left (an RPC whose actor left)
            with contextlib.suppress(Exception):
                self._on_loop(end_tasks(_END_TASKS_S), timeout_s=_END_TASKS_S + 5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _serve(
        self, requests: AsyncIterator[pb.ActorMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LearnerMessage]:
        peer = context.peer()
        host = _host(peer)
        slot = client = None
        connections = self._peers.setdefault(host, {})
        connections[peer] = connections.get(peer, 0) + 1
        try:
            if len(connections) > self.max_per_peer:
                raise _Rejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{host} holds streams on {self.max_per_peer} connections already",
                )
            # The token comes with the stream's headers: check it before reading anything, so
            # that a stream without it holds nothing an actor with it needs.
            if not self._authenticated(context):
                await self._refuse_unauthenticated(requests)
            hello = await self._read_hello(requests)
            try:
                assignment, client = await self._take_slot()
            except _Redirected as redirect:  # another replica takes it: this stream ends here
                log.info(
                    "actor %s sent to %s", safe_name(hello.actor_name or peer), redirect.address
                )
                yield pb.LearnerMessage(redirect=pb.Redirect(address=redirect.address))
                return
            slot = assignment.slot
            name = safe_name(hello.actor_name or peer)
            async for reply in self._bridge(assignment, client, name, requests):
                yield reply
        except _Rejected as e:
            self._refused(peer, e)
            await context.abort(e.code, str(e))
        finally:
            connections[peer] -= 1
            if not connections[peer]:
                del connections[peer]
            if not connections:
                del self._peers[host]
            if client is not None:
                replies = self._replies.pop(id(client), None)
                if replies is not None:
                    replies.close()
                client.close()
            if slot is not None:
                self._release(slot)

    async def _read_hello(self, requests: AsyncIterator[pb.ActorMessage]) -> pb.Hello:
        """The stream's first message, if it is a hello of our protocol sent in time."""
        if self._pending >= MAX_PENDING_HELLOS:
            raise _Rejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_PENDING_HELLOS} other streams are waiting to say hello; try again",
            )
        self._pending += 1
        try:
            first = await _first(requests, self._hello_timeout_s)
        finally:
            self._pending -= 1
        if first is _TIMED_OUT:
            raise _Rejected(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no hello within {self._hello_timeout_s:g} s"
            )
        if _kind(first) != "hello":
            raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, "first message must be hello")
        if first.hello.protocol != PROTOCOL:
            raise _Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"actor speaks protocol {first.hello.protocol}, this learner {PROTOCOL}: "
                "run the same seedbed version on both",
            )
        return first.hello

    def _refused(self, peer: str, refusal: _Rejected) -> None:
        """Count a refusal; warn of it unless one of its kind was warned of lately.

        A flood of bad streams must neither flood the log nor hide in it: the first of each
        status code is logged, then one in every _LOG_REFUSALS_EVERY_S with how many more
        there were meanwhile (the rest are told at ``stop``).
        """
        reason, code = str(refusal), refusal.code
        self.rejected.append(reason)
        self.rejected_total += 1
        now = time.monotonic()
        if now - self._last_warned.get(code, -math.inf) < _LOG_REFUSALS_EVERY_S:
            self._unwarned[code] = self._unwarned.get(code, 0) + 1
            return
        self._last_warned[code] = now
        more = self._unwarned.pop(code, 0)
        also = f" (and {more} more with {code.name} since the last such warning)" if more else ""
        log.warning("refused actor %s: %s%s", peer, reason, also)

    def _authenticated(self, context: grpc.aio.ServicerContext) -> bool:
        sent = dict(context.invocation_metadata() or ()).get("authorization", "")
        return hmac.compare_digest(sent.encode(), b"Bearer " + self._token)

    async def _refuse_unauthenticated(self, requests: AsyncIterator[pb.ActorMessage]) -> None:
        """Refuse a stream without the token, after a moment's wait for its first message.

        Refused while its hello is still in flight, a real actor with a wrong token would read
        INTERNAL (its write fails first) instead of the reason. A few such streams at a time may
        wait up to _COURTESY_S; a flood of them finds no room and is refused at once.
        """
        if self._courtesies < _COURTESIES:
            self._courtesies += 1
            try:
                await _first(requests, min(_COURTESY_S, self._hello_timeout_s))
            finally:
                self._courtesies -= 1
        raise _Rejected(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong token: give the actor --token-file with the learner's token",
        )

    async def _take_slot(self) -> tuple[Assignment, Any]:
        """A free slot's assignment and its open client (an ``ActorTransport`` with a
        ``reply_fd``), a refusal, or at the front door ``_Redirected`` where another replica
        should take the actor (on the loop: no lock). ``_release`` frees the slot."""
        if self._stopping.is_set():
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, "training is over")
        if self.placement is not None:
            address = self.placement.place(self.connected)
            if address is not None:
                raise _Redirected(address)
        if not self._free:
            raise _Rejected(grpc.StatusCode.RESOURCE_EXHAUSTED, slots_taken(self._num_slots))
        self.connections += 1
        slot = self._free.pop(0)
        try:
            return self._assign(slot, self.connections), self._connect(slot).open()
        except BaseException:
            self._free.append(slot)
            raise

    def _release(self, slot: int) -> None:
        """Slot ``slot`` is free again: its stream ended and its client is closed."""
        self._free.append(slot)

    async def _bridge(
        self,
        assignment: Assignment,
        client: Any,
        name: str,
        requests: AsyncIterator[pb.ActorMessage],
    ) -> AsyncIterator[pb.LearnerMessage | bytes]:
        """Relay one actor's steps into its slot and the actions back, until either end stops."""
        slot = assignment.slot
        log.info("actor %s connected to slot %d", name, slot)
        reply = ActionsReply(assignment)  # the answers' bytes, without a message per step
        decode = StepDecoder(assignment)
        acted_fields = assignment.acted()
        sent = -1  # the newest policy version this actor was sent
        refused_in_a_row = 0  # steps with a non-finite value (see seedbed.transport.checks)
        yield assignment.to_message()
        if acted_fields:
            sent, policy = self._newer_policy(sent)
            if policy is not None:
                yield policy  # the actor acts from its first step on
        async for message in requests:
            if _kind(message) != "step":
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, "expected a step")
            try:
                arrays, acted = decode(message.step)
            except ValueError as err:
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"bad step: {err}") from None
            _, why = check_step(arrays[0], arrays[1], acted or None)
            refused_in_a_row = refused_in_a_row + 1 if why else 0
            if refused_in_a_row >= REFUSED_IN_A_ROW:
                self.disconnected += 1
                raise _Rejected(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{refused_in_a_row} steps in a row were refused ({why}): "
                    "fix the actor's environment",
                )
            try:
                actions = await self._call(client, arrays, acted or None)
            except ConnectionError:
                yield pb.LearnerMessage(stop=pb.Stop(reason="training is over"))
                return
            if acted_fields:
                sent, policy = self._newer_policy(sent)
                if policy is not None:
                    yield policy
            yield reply(actions)
        log.info("actor %s left slot %d", name, slot)

    def _newer_policy(self, sent: int) -> tuple[int, pb.LearnerMessage | None]:
        """The board's policy as a message if it is newer than version ``sent``."""
        post = self._board.read(sent)
        if post is None:
            return sent, None
        payload, version = post
        return version, pb.LearnerMessage(policy=pb.Policy(version=version, payload=payload))

    async def _call(
        self, client: Any, arrays: list[np.ndarray], acted: dict[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """``client.call`` without blocking the loop: await the reply pipe, then collect."""
        client.submit(*arrays, acted)
        replies = self._replies.get(id(client))
        if replies is None:
            replies = self._replies[id(client)] = _ReplyPipe(self._loop, client.reply_fd)
        await replies.answered()
        return client.collect()


class _ReplyPipe:
    """Wakes a stream's handler when its reply pipe turns readable. The reader stays on the
    loop while the stream lives: adding and removing it per step costs two epoll calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._loop, self._fd = loop, fd
        self._waiter: asyncio.Future | None = None
        self._watching = False
        self._unwaited = 0  # calls in a row with no step waiting

    async def answered(self) -> None:
        """Return once the pipe holds the answer (or its end: ``collect`` then says so)."""
        self._waiter, self._unwaited = self._loop.create_future(), 0
        if not self._watching:
            self._loop.add_reader(self._fd, self._ready)
            self._watching = True
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _ready(self) -> None:
        if self._waiter is None:
            # Once: the answer's own wake-up, queued before the handler read it. Again: the
            # pipe is at its end (the learner closed) and would wake the loop until the next
            # step, so let go of it.
            self._unwaited += 1
            if self._unwaited > 1:
                self.close()
        elif not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False


_TIMED_OUT = object()


async def _first(requests: AsyncIterator[pb.ActorMessage], timeout_s: float) -> Any:
    """A stream's first message: None if it ended first, _TIMED_OUT if none came in time."""
    try:
        return await asyncio.wait_for(anext(aiter(requests), None), timeout_s)
    except asyncio.TimeoutError:
        return _TIMED_OUT


def _host(peer: str) -> str:
    """The address part of gRPC's peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    return peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer


def _with_port(address: str, port: int) -> str:
    return f"{address.rsplit(':', 1)[0]}:{port}"


WIRES = ("grpc", "socket")


class _Aborted(Exception):
    """A socket-wire stream ended by ``_SocketContext.abort`` (its refusal sent)."""


class _SocketContext:
    """What ``ActorGateway._serve`` asks of gRPC's servicer context, for a socket-wire stream:
    the peer, the token (as gRPC's metadata), and an abort that sends the refusal."""

    def __init__(self, stream: FrameProtocol) -> None:
        self._stream = stream
        self.token: bytes | None = None

    def peer(self) -> str:
        return self._stream.peer()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.token is None:
            return ()
        return (("authorization", "Bearer " + self.token.decode("utf-8", "replace")),)

    def stop(self, code: grpc.StatusCode, reason: str) -> None:
        """Send the actor a ``Stop`` carrying ``code``: why its stream ends."""
        stop = pb.Stop(reason=reason, status=code.value[0])
        self._stream.write(pb.LearnerMessage(stop=stop).SerializeToString())

    async def abort(self, code: grpc.StatusCode, reason: str) -> None:
        self.stop(code, reason)
        raise _Aborted(reason)


async def _messages(stream: FrameProtocol, limit: int) -> AsyncIterator[Any]:
    """A socket-wire stream's messages as gRPC's deserializer gives them (``wire.parse``); the
    iteration ends when the actor closes the connection."""
    while True:
        try:
            frame = await stream.read()
        except ConnectionError:
            return
        except TooLarge as error:
            yield Malformed(str(error))
            return
        yield parse(frame, limit)


def _server_tls(tls: tuple[bytes, bytes]) -> ssl.SSLContext:
    """A TLS server context from PEM bytes (certificate, key). ``ssl`` loads them only from
    files: they pass through a private temporary directory, removed at once."""
    cert, key = tls
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="seedbed-tls-") as folder:
        paths = []
        for name, data in (("cert.pem", cert), ("key.pem", key)):
            path = os.path.join(folder, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(path)
        context.load_cert_chain(*paths)
    return context
